#!/usr/bin/env bash
# Session 21, call 5: the masked-copy kernels in the record. A coordinate descent at down 6144 from the pick
# (results/lut_s20/start_down_6144.json), the tables re-exported with its store, then both GEMMs benched at
# 1536, 6144 and 24576 routes from the tables.
#   OUT=/tmp/out bash results/lut_s21/call5.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 100 python -m moetune sweep --db /root/c5.sqlite --budget 14 --time-limit 80 --quiet \
  -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 6144 --strategy coordinate \
  --start results/lut_s20/start_down_6144.json > "$OUT/coord.log" 2>&1
grep "measurement(s) written" "$OUT/coord.log"
python -c "import sqlite3; sqlite3.connect('/root/c5.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/c5.sqlite > "$OUT/fp4_coord6144_s21.sqlite.gz"
bash benchmarks/export_tables.sh /root/c5.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
for k in down gate_up; do
  timeout 150 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.$k --routes 1536 6144 24576 \
    --csv "$OUT/bench_$k.csv" --markdown "$OUT/bench_$k.md" > "$OUT/bench_$k.log" 2>&1
  grep fp4_prefill "$OUT/bench_$k.md" | cut -d'|' -f2,5,9,12,13,16
done
