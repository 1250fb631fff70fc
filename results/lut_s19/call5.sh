#!/usr/bin/env bash
# Session 19, call 5: DECODE_WARPS with the epilogue through shared memory (whole rows a warp, 16 B a thread) and
# the row max back in the kernel: GPU tests, timings at 18432 / 24576 routes, ablations (full / no_store).
#   OUT=/tmp/out bash results/lut_s19/call5.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q tests/test_fp4_wgmma.py -k "variants" > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
S='"SWAP_AB": 0, "DECODE_WARPS": 4, "BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8'
timeout 300 python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 18432 24576 --configs \
  "{$S, \"num_stages\": 2, \"GROUP_SIZE_M\": 8}" "{$S, \"num_stages\": 3, \"GROUP_SIZE_M\": 8}" \
  "{$S, \"num_stages\": 3, \"GROUP_SIZE_M\": 1}" "{$S, \"num_stages\": 2, \"GROUP_SIZE_M\": 1}" > "$OUT/gluon.log" 2>&1
tail -22 "$OUT/gluon.log"
timeout 200 python benchmarks/ws_ablation.py --variants full no_store no_lut no_mma --gemm down > "$OUT/ablation.log" 2>&1
tail -6 "$OUT/ablation.log"
