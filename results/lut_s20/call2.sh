#!/usr/bin/env bash
# Session 20, call 2: A_RESIDENT and OUT_DTYPE bf16 on the H200. The GPU tests of the Gluon kernels (the new
# cases: resident activations against the ring, bf16 rows against the fp32 rows rounded), then down 24576
# timed (ws_ablation, no part ablated) for the table's pick and its resident / bf16 variants.
#   OUT=/tmp/out bash results/lut_s20/call2.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 300 python -m pytest -q -m gpu tests/test_fp4_wgmma.py -x > "$OUT/gpu_tests.log" 2>&1
tail -4 "$OUT/gpu_tests.log"
B='"BLOCK_SIZE_M": 128, "num_warps": 8, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4'
for c in "{$B, \"BLOCK_SIZE_N\": 128, \"num_stages\": 2}" \
         "{$B, \"BLOCK_SIZE_N\": 128, \"num_stages\": 2, \"A_RESIDENT\": 1}" \
         "{$B, \"BLOCK_SIZE_N\": 64, \"num_stages\": 2, \"A_RESIDENT\": 1}" \
         "{$B, \"BLOCK_SIZE_N\": 64, \"num_stages\": 3, \"A_RESIDENT\": 1}" \
         "{\"BLOCK_SIZE_M\": 128, \"num_warps\": 8, \"GROUP_SIZE_M\": 1, \"DECODE_WARPS\": 8, \"BLOCK_SIZE_N\": 128, \"num_stages\": 2, \"A_RESIDENT\": 1}"; do
  echo "$c" >> "$OUT/timing.log"
  timeout 150 python benchmarks/ws_ablation.py --gemm down --config "$c" --variants full bf16_out \
    >> "$OUT/timing.log" 2>&1
done
grep -E "^\{|^\| (full|bf16)" "$OUT/timing.log" | cut -c1-200
