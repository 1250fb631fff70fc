#!/usr/bin/env bash
# Session 17, last call: IMPL gluon SWAP_AB 0 with SCALE_RING 0 (one CTA barrier a chunk; SCALE_RING 1 is the
# first version, four): GPU tests, a sweep at 36-192 rows an expert from its tiles, the tables re-exported with
# it on the device, and the bench at the points.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED" "$OUT/gpu_tests.log" | head
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes "${ROUTES:-9216,12288,15048,18432,24576,36864,49152}" \
  --strategy coordinate --budget "${BUDGET:-12}" --start benchmarks/fp4_gluon_smem_one_barrier_starts.json \
  --db /root/smem2.sqlite --time-limit "${LIMIT:-150}" --quiet > "$OUT/sweep.log" 2>&1
grep "written" "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/smem2.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/smem2.sqlite > "$OUT/fp4_smem2_s17.sqlite.gz"
bash benchmarks/export_tables.sh /root/smem2.sqlite > "$OUT/export.log" 2>&1; tail -1 "$OUT/export.log"
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,9,12,13,16
