#!/usr/bin/env bash
# Session 18, call 8: GPU tests of the SWAP_AB 0 variants (DECODE_WARPS now persistent), then DECODE_WARPS
# against the tables' picks.   OUT=/tmp/out bash results/lut_s18/call8.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 150 python -m pytest -q tests/test_fp4_wgmma.py -k "variants" > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
S='"SWAP_AB": 0, "GROUP_SIZE_M": 1'
timeout 300 python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 6144 12288 24576 --configs \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 2, \"DECODE_WARPS\": 4}" \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 3, \"DECODE_WARPS\": 4}" \
  "{$S, \"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 3, \"DECODE_WARPS\": 8}" \
  "{$S, \"BLOCK_SIZE_M\": 64, \"BLOCK_SIZE_N\": 128, \"num_warps\": 4, \"num_stages\": 3, \"DECODE_WARPS\": 4}" \
  > "$OUT/gluon.log" 2>&1
tail -18 "$OUT/gluon.log" | cut -d'|' -f2-7
