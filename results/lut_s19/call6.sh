#!/usr/bin/env bash
# Session 19, call 6: DECODE_WARPS 4 with 120 / 136 decode registers against DECODE_WARPS 8 (72), down 24576 and
# gate/up 24576 (benchmarks/ws_ablation.py, variant full).   OUT=/tmp/out bash results/lut_s19/call6.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T='"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8'
for g in down gate_up; do
  for st in 2 3; do
    for dw in "4 120" "4 136" "8 72"; do
      set -- $dw
      timeout 120 python benchmarks/ws_ablation.py --gemm $g --decode-regs $2 \
        --config "{$T, \"num_stages\": $st, \"DECODE_WARPS\": $1}" 2>&1 | tail -1 | tee -a "$OUT/regs.log" | \
        python -c "import json,sys; r=json.loads(sys.stdin.read()); print(r['gemm'], 's$st', 'dw$1', 'regs$2', r['us'])" \
        || echo "$g s$st dw$1 regs$2 failed"
    done
  done
done
