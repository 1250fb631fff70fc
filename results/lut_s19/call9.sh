#!/usr/bin/env bash
# Session 19, call 9: every GPU-marked test on the final code (Gluon FP4 kernels, the gather).
#   OUT=/tmp/out bash results/lut_s19/call9.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 280 python -m pytest -q -m gpu tests/test_fp4_wgmma.py tests/test_gather_rows.py \
  > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
