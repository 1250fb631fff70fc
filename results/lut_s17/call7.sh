#!/usr/bin/env bash
# Session 17: the SWAP_AB 0 kernel with one wait and one CTA barrier a chunk (was four barriers: the compiler's
# for each shared-memory hazard): GPU tests, then the Gluon bench at 12288-36864 routes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -2 "$OUT/gpu_tests.log"
grep -E "^FAILED" "$OUT/gpu_tests.log" | head -20
s='"SWAP_AB": 0, "SCALE_RING": 1'
python benchmarks/gluon_fp4.py --out "$OUT/g" --routes ${ROUTES:-12288 24576 36864} --configs \
  "{\"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 64, \"num_warps\": 8, \"num_stages\": 2, $s}" \
  "{\"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 64, \"num_warps\": 8, \"num_stages\": 3, $s}" \
  "{\"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 128, \"num_warps\": 8, \"num_stages\": 2, $s}" \
  "{\"BLOCK_SIZE_M\": 64, \"BLOCK_SIZE_N\": 128, \"num_warps\": 4, \"num_stages\": 2, $s}" \
  "{\"BLOCK_SIZE_M\": 64, \"BLOCK_SIZE_N\": 128, \"num_warps\": 4, \"num_stages\": 3, $s}" \
  "{\"BLOCK_SIZE_M\": 128, \"BLOCK_SIZE_N\": 64, \"num_warps\": 4, \"num_stages\": 2, $s}" \
  > "$OUT/gluon_bench.log" 2>&1
tail -44 "$OUT/gluon_bench.log" | grep "^|"
