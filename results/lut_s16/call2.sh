#!/usr/bin/env bash
# Session 16, device call 2: the fp4 tables' picks at every density again (resumed from session 15's cross
# store, so only new pairs are measured), a second refine round from those measurements, and the fp8
# DeepSeek-V3 TP8 bench with the cross-pooled tables.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
H=results/h200_tables
zcat $H/fp4_prefill_deepseek-v4-flash_tp2_cross_s15.sqlite.gz > /root/cross3.sqlite
OUT=$OUT/c DB=/root/cross3.sqlite LIMIT=150 bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
CROSS=/root/cross3.sqlite BUDGET=14 LIMIT=150 OUT=$OUT/r DB=/root/refine2.sqlite bash benchmarks/h200_tables.sh refine \
  > "$OUT/refine.log" 2>&1
python -m moetune bench -m deepseek-v3 --tp 8 -k fp8_decode --tokens 1,4,12,14,16,48,64 --csv "$OUT/bench_fp8_s16.csv" \
  > "$OUT/bench_fp8.log" 2>&1
tail -25 "$OUT/bench_fp8.log"
for db in cross3 refine2; do
  python -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)').close()" /root/$db.sqlite
  gzip -c /root/$db.sqlite > "$OUT/$db.sqlite.gz"
done
grep -h "measurement(s) written\|routes" "$OUT/cross.log" "$OUT/refine.log" | head
