#!/usr/bin/env bash
# Session 20, call 8: down at 5376 / 6144 / 6840 routes, where the table's pick (SWAP_AB 1 BM32 BN64, SCALE_RING 1)
# sits at 2.0x the memory floor and few of its Gluon neighbours were ever measured (50 Gluon rows at 6144 in all
# stores): a coordinate sweep from the pick (every one-step neighbour, each checked against the reference), the
# tables re-exported with it, down benched.
#   OUT=/tmp/out bash results/lut_s20/call8.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 330 python -m moetune sweep --db /root/coord20.sqlite --budget 40 --time-limit 100 --quiet \
  -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 5376,6144,6840 --strategy coordinate \
  --start results/lut_s20/start_down_6144.json > "$OUT/coord.log" 2>&1
grep "measurement(s) written" "$OUT/coord.log"
python -c "import sqlite3; sqlite3.connect('/root/coord20.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/coord20.sqlite > "$OUT/fp4_coord6144_s20.sqlite.gz"
bash benchmarks/export_tables.sh /root/coord20.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
tar czf "$OUT/configs_fp4.tgz" configs/sm_90/fp4_prefill.*
timeout 150 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill.down --routes 1536,6144,24576 \
  --csv "$OUT/bench_down.csv" --markdown "$OUT/bench_down.md" > "$OUT/bench_down.log" 2>&1
head -8 "$OUT/bench_down.md" | cut -d'|' -f2,5,12,13,16
