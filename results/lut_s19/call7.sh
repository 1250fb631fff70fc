#!/usr/bin/env bash
# Session 19, call 7: what the per-route fp32 output costs at down 24576 (DECODE_WARPS 4, 136 decode registers):
# full, no_store, bf16_out.   OUT=/tmp/out bash results/lut_s19/call7.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 200 python benchmarks/ws_ablation.py --variants full no_store bf16_out --gemm down --decode-regs 136 \
  --config '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "DECODE_WARPS": 4}' \
  > "$OUT/ablation.log" 2>&1
tail -5 "$OUT/ablation.log"
