#!/usr/bin/env bash
# Prepared in session 17 for the next device window (not run): the GPU tests once more (session 17's last run
# had the SCALE_RING 0 BM256 case, since refused, stop the process on a misaligned address), every fp4 pick at
# every density (the SWAP_AB 0 SCALE_RING 0 entries were never crossed), then the bench at the points.
#   OUT=/tmp/out bash results/lut_s17/next_session.sh    (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED" "$OUT/gpu_tests.log" | head
OUT=$OUT/c DB=/root/cross18.sqlite MAX_ROUTES=${MAX_ROUTES:-49152} LIMIT=${LIMIT:-150} \
  bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/cross18.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross18.sqlite > "$OUT/fp4_cross_s18.sqlite.gz"
bash benchmarks/export_tables.sh /root/cross18.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,12,13,16
# Then copy $OUT/fp4_cross_s18.sqlite.gz to results/h200_tables/, add it to benchmarks/export_tables.sh, re-export.
