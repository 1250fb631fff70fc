#!/usr/bin/env bash
# Session 18, call 10: a sweep of DECODE_WARPS (persistent, warp-specialized) from its starts at 72-192 rows an
# expert, the tables re-exported with it, the bench at the points.
#   OUT=/tmp/out bash results/lut_s18/call10.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes "${ROUTES:-18432,24576,36864,49152}" \
  --strategy coordinate --budget "${BUDGET:-6}" --start benchmarks/fp4_gluon_ws_starts.json --db /root/ws.sqlite \
  --time-limit "${LIMIT:-100}" --quiet > "$OUT/sweep.log" 2>&1
grep "written" "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/ws.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/ws.sqlite > "$OUT/fp4_ws_s18.sqlite.gz"
bash benchmarks/export_tables.sh /root/ws.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,12,13,16
