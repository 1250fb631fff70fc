#!/usr/bin/env bash
# Session 20, call 9: what the SWAP_AB 1 kernel's parts cost at down 6144 routes (the table's pick: BM32 BN64,
# 4 warps, 3 stages, SCALE_RING 1), before building an activation-resident variant of it: no_act (no activation
# or activation-scale copies), no_lut (no decode), no_mma (no wgmma).
#   OUT=/tmp/out bash results/lut_s20/call9.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C='{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "GROUP_SIZE_M": 8, "SWAP_AB": 1, "SCALE_RING": 1}'
timeout 250 python benchmarks/ws_ablation.py --gemm down --routes 6144 --config "$C" \
  --variants full no_act no_lut no_mma no_lut_no_mma full > "$OUT/ablation.log" 2>&1
tail -9 "$OUT/ablation.log"
