#!/usr/bin/env bash
# Session 23, call 6: with the tables re-exported from calls 1-5 (RING_SPLIT 1 across the SWAP_AB 1 band),
# every GPU test (log in $OUT), then `moetune bench` at the issue-5 points (default, heuristic and the
# table's pick, each checked first), written to $OUT/bench_fp4_s23.{csv,md}.
#   OUT=/tmp/out bash results/lut_s23/final.sh      (~5 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 220 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4_s23.csv" --markdown "$OUT/bench_fp4_s23.md" > "$OUT/bench.log" 2>&1
MOETUNE_TEST_GPU=1 timeout 300 python -m pytest -q -m gpu tests > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
cat "$OUT/bench_fp4_s23.md"
