#!/usr/bin/env bash
# Session 21, call 1: where down 6144's last percent may be. The pick (SWAP_AB 1 BM32 BN64 s3 SCALE_RING 1)
# timed as it is, with the grid the routing fills instead of the worst case's (exact_grid: 40% of the
# launched programs exit at once at 6144 routes, BM32), with 4 and 5 stages, and with 96 registers (5 CTAs
# an SM); gate/up 6144's pick with exact_grid too.
#   OUT=/tmp/out bash results/lut_s21/call1.sh      (~3 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P='{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1, "SWAP_AB": 1, "GROUP_SIZE_M": 8}'
A=benchmarks/ws_ablation.py
{
python $A --variants full exact_grid full exact_grid --gemm down --routes 6144 --config "$P"
python $A --variants full --gemm down --routes 6144 --config "${P/\"num_stages\": 3/\"num_stages\": 4}"
python $A --variants full --gemm down --routes 6144 --config "${P/\"num_stages\": 3/\"num_stages\": 5}"
python $A --variants full --gemm down --routes 6144 --config "$P" --maxnreg 96
python $A --variants full exact_grid --gemm gate_up --routes 6144 --config "$P"
} 2>&1 | tee "$OUT/call1.log" | grep '^{' | python -c "
import json, sys
print('| gemm | routes | variant | config | maxnreg | us |'); print('|---|---:|---|---|---:|---:|')
for line in sys.stdin:
    r = json.loads(line)
    c = r.get('config') or {}
    print(f\"| {r.get('gemm')} | {r.get('routes')} | {r['variant']} | s{c.get('num_stages')} BM{c.get('BLOCK_SIZE_M')} | {r.get('maxnreg')} | {r['us']} |\")
"
