#!/usr/bin/env bash
# Session 21, call 4: the Gluon kernels' copies past a tile's last chunk read nothing (masked cp.async; they
# re-read the last chunk before: 3 of down's 8 chunks a tile at 3 stages). GPU tests of every Gluon kernel,
# then the picks timed (the old kernel's in calls 1-3 of this session: down 6144 288.6-294.3 us).
#   OUT=/tmp/out bash results/lut_s21/call4.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 240 python -m pytest -q -m gpu tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
A=benchmarks/ws_ablation.py
P='"BLOCK_SIZE_N": 64, "num_warps": 4, "SCALE_RING": 1, "SWAP_AB": 1, "GROUP_SIZE_M": 8'
{
for s in 3 4 3 4 2; do
  python $A --variant full --gemm down --routes 6144 --config "{\"BLOCK_SIZE_M\": 32, \"num_stages\": $s, $P}"
done
python $A --variant full --gemm gate_up --routes 6144 --config "{\"BLOCK_SIZE_M\": 32, \"num_stages\": 3, $P}"
python $A --variant full --gemm gate_up --routes 6144 --config "{\"BLOCK_SIZE_M\": 32, \"num_stages\": 4, $P}"
python $A --variant full --gemm down --routes 1536 --config "{\"BLOCK_SIZE_M\": 16, \"num_stages\": 3, $P}"
python $A --variant full --gemm down --routes 1536 --config "{\"BLOCK_SIZE_M\": 16, \"num_stages\": 3, \"A_RESIDENT\": 1, $P}"
python $A --variant full --gemm down --routes 12288 --config '{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1, "SWAP_AB": 0}'
} 2>&1 | tee "$OUT/call4.log" | grep '^{' | python -c "
import json, sys
print('| gemm | routes | BM | SWAP_AB | stages | A_RESIDENT | us |'); print('|---|---:|---:|---:|---:|---:|---:|')
for line in sys.stdin:
    r = json.loads(line); c = r.get('config') or {}
    print(f\"| {r.get('gemm')} | {r.get('routes')} | {c.get('BLOCK_SIZE_M')} | {c.get('SWAP_AB')} | {c.get('num_stages')} | {c.get('A_RESIDENT', 0)} | {r['us']} |\")
"
