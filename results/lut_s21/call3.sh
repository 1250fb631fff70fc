#!/usr/bin/env bash
# Session 21, call 3: what the row maxima of the weight scales (loaded at each tile's start, before the
# first decode) cost the SWAP_AB 1 picks: down 6144 and gate/up 6144 with and without them (no_rowmax).
#   OUT=/tmp/out bash results/lut_s21/call3.sh      (~1.5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P='{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1, "SWAP_AB": 1, "GROUP_SIZE_M": 8}'
A=benchmarks/ws_ablation.py
{
python $A --variants full no_rowmax full no_rowmax no_lut --gemm down --routes 6144 --config "$P"
python $A --variants full no_rowmax --gemm gate_up --routes 6144 --config "$P"
python $A --variants full no_rowmax --gemm down --routes 1536 --config "${P/\"BLOCK_SIZE_M\": 32/\"BLOCK_SIZE_M\": 16}"
} 2>&1 | tee "$OUT/call3.log" | grep '^{' | python -c "
import json, sys
print('| gemm | routes | BM | variant | us |'); print('|---|---:|---:|---|---:|')
for line in sys.stdin:
    r = json.loads(line); c = r.get('config') or {}
    print(f\"| {r.get('gemm')} | {r.get('routes')} | {c.get('BLOCK_SIZE_M')} | {r['variant']} | {r['us']} |\")
"
