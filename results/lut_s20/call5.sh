#!/usr/bin/env bash
# Session 20, call 5: decode-partition registers (ws_ablation --decode-regs) with and without A_RESIDENT, down
# 24576, bf16 rows (the resident BN128 tile fits only with them) and fp32 rows for the ring kernel.
#   OUT=/tmp/out bash results/lut_s20/call5.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B='"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4'
for r in 104 112 120 128; do
  timeout 60 python benchmarks/ws_ablation.py --gemm down --config "{$B, \"A_RESIDENT\": 1}" --variant bf16_out \
    --decode-regs $r >> "$OUT/regs.log" 2>&1
done
for v in bf16_out full; do for r in 112 120 128 136; do
  timeout 60 python benchmarks/ws_ablation.py --gemm down --config "{$B}" --variant $v --decode-regs $r \
    >> "$OUT/regs.log" 2>&1
done; done
python - "$OUT/regs.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["variant"], r["config"].get("A_RESIDENT", 0), r["decode_regs"], r["us"])
PY
