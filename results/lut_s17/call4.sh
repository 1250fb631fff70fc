#!/usr/bin/env bash
# Session 17, fourth call: a sweep of V4-Flash TP2 at 36-192 rows an expert from the IMPL gluon SWAP_AB 0 tiles
# (benchmarks/fp4_gluon_smem_starts.json, all measured first, then coordinate).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROUTES=${ROUTES:-9216,12288,15048,18432,24576,36864,49152}
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes "$ROUTES" --strategy coordinate \
  --budget "${BUDGET:-16}" --start benchmarks/fp4_gluon_smem_starts.json --db /root/smem.sqlite \
  --time-limit "${LIMIT:-330}" --quiet > "$OUT/sweep.log" 2>&1
tail -4 "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/smem.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/smem.sqlite > "$OUT/fp4_smem_s17.sqlite.gz"
