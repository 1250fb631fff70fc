#!/usr/bin/env bash
# Session 20, call 1: would activations held per M-block (no activation copies) and a bf16 per-route output
# together take down 24576 under 0.515 ms? The table's pick (BM128 BN128 8 warps, 2 stages, GROUP_SIZE_M 1,
# DECODE_WARPS 4) with those parts ablated; then the whole MoE's per-kernel time (session 19's next_session).
#   OUT=/tmp/out bash results/lut_s20/call1.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C='{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4}'
timeout 280 python benchmarks/ws_ablation.py --gemm down --config "$C" \
  --variants full no_act bf16_out no_act_bf16_out no_store no_act_no_store full > "$OUT/ablation.log" 2>&1
tail -10 "$OUT/ablation.log"
timeout 250 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 24576 6144 --profile > "$OUT/e2e.log" 2>&1
tail -30 "$OUT/e2e.log" | cut -c1-160
