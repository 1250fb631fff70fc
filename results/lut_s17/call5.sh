#!/usr/bin/env bash
# Session 17, fifth call: with the SWAP_AB 0 picks in the fp4 tables, every pick at every density (`cross`,
# a fresh store), then the bench at the points.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=$OUT/c DB=/root/cross17b.sqlite MAX_ROUTES=${MAX_ROUTES:-49152} LIMIT=${LIMIT:-150} \
  bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/cross17b.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross17b.sqlite > "$OUT/fp4_cross2_s17.sqlite.gz"
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md"
