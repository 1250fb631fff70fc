#!/usr/bin/env bash
# Session 23, call 11 (the budget's last ~5 minutes): the whole FP4 MoE end to end at TP 2 with the final
# tables (benchmarks/fp4_moe_e2e.py), then every DeepSeek-V4-Flash TP 1 table pick at every density of its
# table (`benchmarks/h200_tables.sh cross`, single GPU), its store kept in $OUT even if the call is cut.
#   OUT=/tmp/out bash results/lut_s23/last.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 70 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 1536 6144 24576 > "$OUT/e2e.log" 2>&1
tail -8 "$OUT/e2e.log"
PICKS='deepseek-v4-flash 1 fp4_prefill' MAX_ROUTES=98304 LIMIT=${LIMIT:-75} GPUS= DB="$OUT/cross_tp1_s23.sqlite" \
  timeout 190 bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
python - <<PY
import sqlite3
con = sqlite3.connect("$OUT/cross_tp1_s23.sqlite"); con.execute("pragma wal_checkpoint(truncate)")
print(con.execute("select kernel, count(*) from measurements group by kernel").fetchall())
PY
