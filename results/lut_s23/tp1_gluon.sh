#!/usr/bin/env bash
# Session 23, call 8: DeepSeek-V4-Flash at TP 1 (gate/up N 4096 K 4096, down N 4096 K 2048), whose tables date
# from session 6 (Triton tiles only). A coordinate sweep at 768-49152 routes started from the sm_90
# heuristic's Gluon tiles (moetune/specs/fp4_prefill.py, _HOPPER_GLUON), its store exported into the tables
# here, then `moetune bench` at TP 1 and TP 2 (default, heuristic and table, each checked first).
#   OUT=/tmp/out bash results/lut_s23/tp1_gluon.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DB=/root/s23_tp1_gluon.sqlite
rm -f $DB*
python - > /root/s23_tp1_starts.json <<'PY'
import json
from moetune.spec import get_spec
from moetune.specs.fp4_prefill import _HOPPER_GLUON
starts = [{**get_spec(f"fp4_prefill.{g}").default, **c} for g, band in _HOPPER_GLUON.items()
          for _, cfgs in band for c in cfgs]
print(json.dumps(starts))
PY
timeout 330 python -m moetune sweep --db $DB --budget ${BUDGET:-10} --time-limit 300 --quiet \
  -m deepseek-v4-flash --tp 1 -k fp4_prefill --routes 768,1536,3072,6144,12288,24576,49152 \
  --strategy coordinate --start /root/s23_tp1_starts.json 2>&1 | tail -8 > "$OUT/sweep_tp1.log"
python - <<PY
import sqlite3
con = sqlite3.connect("$DB"); con.execute("pragma wal_checkpoint(truncate)"); con.close()
PY
gzip -c $DB > "$OUT/fp4_prefill_deepseek-v4-flash_tp1_gluon_s23.sqlite.gz"
bash benchmarks/export_tables.sh $DB > "$OUT/export.log" 2>&1
for tp in 1 2; do
  timeout 150 python -m moetune bench -m deepseek-v4-flash --tp $tp -k fp4_prefill --routes 1536,6144,24576 \
    --markdown "$OUT/bench_tp$tp.md" > "$OUT/bench_tp$tp.log" 2>&1
  cut -d'|' -f2,5,9,10,12,13,16 "$OUT/bench_tp$tp.md"
done
