#!/usr/bin/env bash
# Session 20, call 3: call 2's resident BN128 runs again (ws_ablation now sets OUT_DTYPE bf16 for bf16_out,
# whose shared-memory check call 2 failed), and BN64 without A_RESIDENT, the comparison call 2 lacked.
#   OUT=/tmp/out bash results/lut_s20/call3.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B='"BLOCK_SIZE_M": 128, "num_warps": 8, "GROUP_SIZE_M": 1'
for c in "{$B, \"DECODE_WARPS\": 4, \"BLOCK_SIZE_N\": 128, \"num_stages\": 2, \"A_RESIDENT\": 1}" \
         "{$B, \"DECODE_WARPS\": 8, \"BLOCK_SIZE_N\": 128, \"num_stages\": 2, \"A_RESIDENT\": 1}" \
         "{$B, \"DECODE_WARPS\": 4, \"BLOCK_SIZE_N\": 64, \"num_stages\": 2}"; do
  echo "$c" >> "$OUT/timing.log"
  timeout 150 python benchmarks/ws_ablation.py --gemm down --config "$c" --variants full bf16_out \
    >> "$OUT/timing.log" 2>&1
done
grep -E "^\{\"BLOCK|^\| (full|bf16)" "$OUT/timing.log" | cut -c1-200
