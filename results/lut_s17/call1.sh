#!/usr/bin/env bash
# Session 17, first sweep call: IMPL gluon with SCALE_RING in the space and the activations in the wgmma K order
# (written by their producers, no copy in the timed call). GPU tests, the Gluon bench at 6144 routes, then a sweep
# of V4-Flash TP2 from the SCALE_RING tiles (benchmarks/fp4_gluon_ring_starts.json: all measured, then coordinate).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q tests/test_fp4_wgmma.py tests/test_fp4_act.py > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 6144 --configs \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 4, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 256, "num_warps": 8, "num_stages": 2, "SCALE_RING": 1}' \
  > "$OUT/gluon_bench.log" 2>&1
tail -16 "$OUT/gluon_bench.log"
ROUTES=${ROUTES:-768,1536,2304,3072,3840,4608,5376,6144,7524,9216,12288,15048,18432}
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes "$ROUTES" --strategy coordinate \
  --budget "${BUDGET:-20}" --start benchmarks/fp4_gluon_ring_starts.json --db /root/ring.sqlite \
  --time-limit "${LIMIT:-360}" --quiet > "$OUT/sweep.log" 2>&1
tail -4 "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/ring.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/ring.sqlite > "$OUT/fp4_ring_s17.sqlite.gz"
