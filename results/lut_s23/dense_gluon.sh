#!/usr/bin/env bash
# Session 23, call 9: the Gluon 128-row tiles at the densest route counts, 73728 and 98304 (288 and 384 rows
# per expert), where the DeepSeek-V4-Flash tables (TP 2 and TP 1) still pick Triton tiles: no sweep had
# started a Gluon tile there. Coordinate sweeps from the sm_90 heuristic's 128-row Gluon tiles (and the
# plain 3-stage one, gate/up's pick at 144 rows), exported into the tables here, then `moetune bench` at
# 98304 routes for both TPs.
#   OUT=/tmp/out bash results/lut_s23/dense_gluon.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DB=/root/s23_dense_gluon.sqlite
rm -f $DB*
python - > /root/s23_dense_starts.json <<'PY'
import json
from moetune.spec import get_spec
from moetune.specs.fp4_prefill import _HOPPER_GLUON
starts = []
for g, band in _HOPPER_GLUON.items():
    base = get_spec(f"fp4_prefill.{g}").default
    for c in band[-1][1]:
        starts += [{**base, **c}, {**base, **c, "DECODE_WARPS": 0, "A_RESIDENT": 0, "num_stages": 3}]
print(json.dumps(starts))
PY
for tp in 2 1; do
  timeout 200 python -m moetune sweep --db $DB --budget ${BUDGET:-8} --time-limit 180 --quiet \
    -m deepseek-v4-flash --tp $tp -k fp4_prefill --routes 73728,98304 \
    --strategy coordinate --start /root/s23_dense_starts.json 2>&1 | tail -4 > "$OUT/sweep_tp$tp.log"
done
python - <<PY
import sqlite3
con = sqlite3.connect("$DB"); con.execute("pragma wal_checkpoint(truncate)"); con.close()
PY
gzip -c $DB > "$OUT/fp4_prefill_deepseek-v4-flash_dense_gluon_s23.sqlite.gz"
bash benchmarks/export_tables.sh $DB > "$OUT/export.log" 2>&1
for tp in 2 1; do
  timeout 100 python -m moetune bench -m deepseek-v4-flash --tp $tp -k fp4_prefill --routes 98304 \
    --markdown "$OUT/bench_tp$tp.md" > "$OUT/bench_tp$tp.log" 2>&1
  cut -d'|' -f2,5,9,10,12,13,16 "$OUT/bench_tp$tp.md"
done
