#!/usr/bin/env bash
# Session 18, call 9: GPU tests of the SWAP_AB 0 variants, then DECODE_WARPS with and without MMA_HALVES against
# the tables' picks.   OUT=/tmp/out bash results/lut_s18/call9.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 150 python -m pytest -q tests/test_fp4_wgmma.py -k "variants" > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
S='"SWAP_AB": 0, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4'
timeout 300 python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 12288 24576 --configs \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 3}" \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 3, \"MMA_HALVES\": 1}" \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 2, \"MMA_HALVES\": 1}" \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 4, \"MMA_HALVES\": 1}" \
  > "$OUT/gluon.log" 2>&1
tail -12 "$OUT/gluon.log" | cut -d'|' -f2-7
