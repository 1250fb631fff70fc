#!/usr/bin/env bash
# Prepared in session 16 for the next device window (not run): IMPL gluon's SCALE_RING on the H200 first, then
# the bench of the current tables (never benched with the Gluon entries). OUT=/tmp/out bash results/lut_s16/next_session.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 python -m pytest -q tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1; tail -3 "$OUT/gpu_tests.log"
python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 1536 6144 12288 24576 --configs \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3}' \
  '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 2, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "SCALE_RING": 1}' \
  '{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "SCALE_RING": 1}' \
  > "$OUT/gluon_bench.log" 2>&1
tail -45 "$OUT/gluon_bench.log"
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md"
# If SCALE_RING wins: add "SCALE_RING": (0, 1) to the fp4 SPACE (moetune/specs/fp4_prefill.py; candidates() must
# keep it to IMPL gluon), add SCALE_RING 1 tiles to benchmarks/fp4_gluon_starts.json, then
# `OUT=$OUT/s DB=/root/g2.sqlite ROUTES=6144,9216,12288,18432,24576 bash benchmarks/h200_tables.sh gluon cross`
# and `bash benchmarks/export_tables.sh <stores>`.
