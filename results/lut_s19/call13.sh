#!/usr/bin/env bash
# Session 19, call 13: align_routes without a host copy (call 12's e2e could not capture it in a CUDA graph):
# its capture test, then the whole fp4_prefill_moe and the sum step (benchmarks/fp4_moe_e2e.py).
#   OUT=/tmp/out bash results/lut_s19/call13.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 40 python -m pytest -q tests/test_fp4_align.py -k captured > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -10
timeout 140 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 24576 6144 > "$OUT/e2e.log" 2>&1
tail -6 "$OUT/e2e.log"
