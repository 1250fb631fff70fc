#!/usr/bin/env bash
# Session 16: IMPL "gluon" (moetune/kernels/fp4_wgmma.py) on the H200: its GPU tests, the bench against the
# tables' picks, then a sweep of the V4-Flash TP2 densities up to 12288 routes started from the Gluon tiles.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q -x tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
grep -q " passed" "$OUT/gpu_tests.log" && ! grep -q "failed" "$OUT/gpu_tests.log" || exit 1
python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 1536 6144 24576 > "$OUT/gluon_bench.log" 2>&1
tail -28 "$OUT/gluon_bench.log"
ROUTES=${ROUTES:-768,1152,1536,2304,2688,3072,3456,3840,4608,5376,6144,6840,7524,8448,9216,12288}
python -m moetune sweep -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes "$ROUTES" --strategy coordinate \
  --budget "${BUDGET:-8}" --start benchmarks/fp4_gluon_starts.json --db /root/gl.sqlite --time-limit "${LIMIT:-200}" \
  --quiet > "$OUT/sweep.log" 2>&1
tail -4 "$OUT/sweep.log"
python -c "import sqlite3; sqlite3.connect('/root/gl.sqlite').execute('PRAGMA wal_checkpoint(TRUNCATE)').close()"
gzip -c /root/gl.sqlite > "$OUT/fp4_gluon_s16.sqlite.gz"
