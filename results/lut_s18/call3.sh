#!/usr/bin/env bash
# Session 18, call 3: the Gluon GPU tests (MMA_HALVES among them, PERSISTENT removed), a sweep of MMA_HALVES
# from its starts at 24-192 rows an expert, the tables re-exported with it, the bench at the points.
#   OUT=/tmp/out bash results/lut_s18/call3.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED" "$OUT/gpu_tests.log" | head
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill \
  --routes "${ROUTES:-6144,9216,12288,15048,18432,24576,36864,49152}" --strategy coordinate --budget "${BUDGET:-8}" \
  --start benchmarks/fp4_gluon_halves_starts.json --db /root/halves.sqlite --time-limit "${LIMIT:-150}" --quiet \
  > "$OUT/sweep.log" 2>&1
grep "written" "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/halves.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/halves.sqlite > "$OUT/fp4_halves_s18.sqlite.gz"
bash benchmarks/export_tables.sh /root/halves.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,9,12,13,16
