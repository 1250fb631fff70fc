#!/usr/bin/env bash
# Session 19, call 8: GPU tests of the final DECODE_WARPS kernel, then every fp4 pick at every density up to
# 49152 routes (the cross; DECODE_WARPS entries included), the tables re-exported with it, the bench.
#   OUT=/tmp/out bash results/lut_s19/call8.sh    (~7 minutes on one H200)
# Then copy $OUT/fp4_cross_s19.sqlite.gz into results/h200_tables/, add it to benchmarks/export_tables.sh and
# re-export (the local export must match $OUT/configs_fp4.tgz).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 150 python -m pytest -q tests/test_fp4_wgmma.py -k "variants or reference" \
  > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
grep -q " passed" "$OUT/gpu_tests.log" && ! grep -q "failed" "$OUT/gpu_tests.log" || exit 1
OUT=$OUT/c DB=/root/cross19.sqlite MAX_ROUTES=${MAX_ROUTES:-49152} LIMIT=${LIMIT:-150} \
  bash benchmarks/h200_tables.sh cross > "$OUT/cross.log" 2>&1
grep "measurement(s) written" "$OUT/cross.log"
python -c "import sqlite3; sqlite3.connect('/root/cross19.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/cross19.sqlite > "$OUT/fp4_cross_s19.sqlite.gz"
bash benchmarks/export_tables.sh /root/cross19.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,12,13,16
