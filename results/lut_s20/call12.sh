#!/usr/bin/env bash
# Session 20, call 12: call 8 again at 6144 routes with the --start fix (the descent now begins at the pick:
# its untried Gluon neighbours, GROUP_SIZE_M 1 / 16 and 2 stages among them), the tables re-exported, down benched.
#   OUT=/tmp/out bash results/lut_s20/call12.sh      (~2 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 100 python -m moetune sweep --db /root/c12.sqlite --budget 14 --time-limit 80 --quiet \
  -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 6144 --strategy coordinate \
  --start results/lut_s20/start_down_6144.json > "$OUT/coord.log" 2>&1
grep "measurement(s) written" "$OUT/coord.log"
python -c "import sqlite3; sqlite3.connect('/root/c12.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/c12.sqlite > "$OUT/fp4_coord6144b_s20.sqlite.gz"
bash benchmarks/export_tables.sh /root/c12.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
timeout 60 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 6144 \
  --csv "$OUT/bench_down.csv" --markdown "$OUT/bench_down.md" > "$OUT/bench_down.log" 2>&1
head -6 "$OUT/bench_down.md" | cut -d'|' -f2,5,12,13,16
