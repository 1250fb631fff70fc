#!/usr/bin/env bash
# Session 17, second call: the bench of the tables exported with call1's store (SCALE_RING Gluon picks), then
# every fp4 table pick at every density of its table (`cross`, a fresh store) so no entry is slower there than
# another entry's config.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md"
OUT=$OUT/c DB=/root/cross17.sqlite LIMIT=${LIMIT:-200} bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/cross17.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross17.sqlite > "$OUT/fp4_cross_s17.sqlite.gz"
