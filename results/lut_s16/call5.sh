#!/usr/bin/env bash
# Session 16: with the Gluon picks in the fp4 tables, every pick at every density (resumed from session 15's
# cross store: only new pairs are measured), then the bench at the points.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
zcat results/h200_tables/fp4_prefill_deepseek-v4-flash_tp2_cross_s15.sqlite.gz > /root/cross4.sqlite
OUT=$OUT/c DB=/root/cross4.sqlite LIMIT=${LIMIT:-150} bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/cross4.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross4.sqlite > "$OUT/fp4_cross_s16.sqlite.gz"
