#!/usr/bin/env bash
# (Measured, then reverted: the table was slower everywhere; moetune/kernels/fp4_wgmma.py at commit eaea296.)
# Session 19, call 11: the e4m3 pools from a 16-entry table (one L1 load a row and group) instead of fp16
# multiplies and conversions in every Gluon kernel: GPU tests, then table against registers (ws_ablation full /
# asm_pool) at the picks of down 24576, down 6144 and gate/up 6144.   OUT=/tmp/out bash results/lut_s19/call11.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 120 python -m pytest -q -m gpu tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
grep -q " passed" "$OUT/gpu_tests.log" && ! grep -q "failed" "$OUT/gpu_tests.log" || exit 1
WS='{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4}'
SW='{"SWAP_AB": 1, "SCALE_RING": 1, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3}'
for run in "down 24576 $WS" "down 6144 $SW" "gate_up 6144 $SW"; do
  read -r g r c <<< "$run"
  timeout 70 python benchmarks/ws_ablation.py --variants full asm_pool asm_pool full --gemm $g --routes $r \
    --config "$c" 2>&1 | tail -4 | sed "s/^/$g $r /" | tee -a "$OUT/pools.log"
done
