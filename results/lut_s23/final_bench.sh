#!/usr/bin/env bash
# Session 23, call 10: with the final tables and the Gluon-aware sm_90 heuristic, `moetune bench` over the
# default route grid (768-98304) for DeepSeek-V4-Flash TP 2 and TP 1: default, heuristic and table, each
# checked first. Markdown and CSV in $OUT.
#   OUT=/tmp/out bash results/lut_s23/final_bench.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for tp in 2 1; do
  timeout 200 python -m moetune bench -m deepseek-v4-flash --tp $tp -k fp4_prefill \
    --markdown "$OUT/bench_tp$tp.md" --csv "$OUT/bench_tp$tp.csv" > "$OUT/bench_tp$tp.log" 2>&1
  cut -d'|' -f2,5,9,10,11,12,13,16 "$OUT/bench_tp$tp.md"
done
