#!/usr/bin/env bash
# Session 22 (for the next session with device time), call 1: the GPU tests of RING_SPLIT and MAXNREG (bit
# for bit against the one-buffer rings and the launcher's register cap; with them the fill-past-K and resident
# tests that share their helper), then the A/B at down 6144 (the table's pick, its GROUP_SIZE_M 1 and
# resident twins and the 16-row ring tile, RING_SPLIT 0 and 1, the 16-row tile also at MAXNREG 96; two runs).
#   OUT=/tmp/out bash results/lut_s22/call1.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 240 python -m pytest -q -m gpu tests/test_fp4_wgmma.py \
  -k "split_ring or register_cap or stages_past or swap_resident" > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
timeout 330 python results/lut_s22/ab_split.py down:6144
