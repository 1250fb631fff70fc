#!/usr/bin/env bash
# Session 22 (for the next session with device time), call 2: the RING_SPLIT (and MAXNREG 96) A/B at the other
# table picks they could move: down 1536 and 3072 (BM16 resident), gate/up 1536 (BM16 ring: also MAXNREG 96)
# and 6144 (BM32 ring).
#   OUT=/tmp/out bash results/lut_s22/call2.sh      (~6 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 570 python results/lut_s22/ab_split.py down:1536 down:3072 gate_up:1536 gate_up:6144
