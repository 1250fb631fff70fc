#!/usr/bin/env bash
# Session 21, call 2: PERSISTENT (SWAP_AB 1: as many programs as the SMs hold, each an equal run of the tiles
# the routing fills) checked bit for bit against the ring on the GPU, then timed against the picks: down 6144
# (BM32), down 1536 (BM16, the resident pick) and gate/up 6144, each with and without A_RESIDENT.
#   OUT=/tmp/out bash results/lut_s21/call2.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q -m gpu tests/test_fp4_wgmma.py -k "swap_resident" \
  > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log"
A=benchmarks/ws_ablation.py
B='"num_warps": 4, "num_stages": 3, "SCALE_RING": 1, "SWAP_AB": 1'
{
for r in 6144 1536; do
  for bm in 32 16; do
    for sw in '"GROUP_SIZE_M": 8' '"GROUP_SIZE_M": 8, "A_RESIDENT": 1' '"GROUP_SIZE_M": 1, "PERSISTENT": 1' \
              '"GROUP_SIZE_M": 1, "PERSISTENT": 1, "A_RESIDENT": 1'; do
      python $A --variant full --gemm down --routes $r --config "{\"BLOCK_SIZE_M\": $bm, \"BLOCK_SIZE_N\": 64, $B, $sw}"
    done
  done
done
for sw in '"GROUP_SIZE_M": 8' '"GROUP_SIZE_M": 1, "PERSISTENT": 1' '"GROUP_SIZE_M": 1, "PERSISTENT": 1, "A_RESIDENT": 1'; do
  python $A --variant full --gemm gate_up --routes 6144 --config "{\"BLOCK_SIZE_M\": 32, \"BLOCK_SIZE_N\": 64, $B, $sw}"
done
} 2>&1 | tee "$OUT/call2.log" | grep '^{' | python -c "
import json, sys
print('| gemm | routes | BM | G | A_RESIDENT | PERSISTENT | us |'); print('|---|---:|---:|---:|---:|---:|---:|')
for line in sys.stdin:
    r = json.loads(line); c = r['config']
    print(f\"| {r['gemm']} | {r['routes']} | {c['BLOCK_SIZE_M']} | {c['GROUP_SIZE_M']} | {c.get('A_RESIDENT', 0)} | {c.get('PERSISTENT', 0)} | {r['us']} |\")
"
