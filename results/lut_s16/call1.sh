#!/usr/bin/env bash
# Session 16, device call 1: K_STEPS against the fp4 picks, then the fp8 tables' picks at every density.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python benchmarks/probe_variants.py --out "$OUT/k" --probe ksteps --family fp4_prefill --routes 1536 3072 6144 \
  --rounds 2 > "$OUT/ksteps.log" 2>&1
tail -30 "$OUT/ksteps.log"
PICKS="deepseek-v3 8 fp8_decode" OUT=$OUT/c DB=/root/c.sqlite LIMIT=${LIMIT:-180} bash benchmarks/h200_tables.sh cross \
  > "$OUT/cross.log" 2>&1
tail -5 "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/c.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/c.sqlite > "$OUT/fp8_cross_s16.sqlite.gz"
