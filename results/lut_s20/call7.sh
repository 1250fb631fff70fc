#!/usr/bin/env bash
# Session 20, call 7: the bench on the committed tables (gate/up and down at 1536, 6144, 24576 routes:
# the shipped default against the table's pick, each checked against the reference), then the whole MoE
# (CUDA graph) and its per-kernel time.
#   OUT=/tmp/out bash results/lut_s20/call7.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 300 python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 \
  --csv "$OUT/bench_fp4.csv" --markdown "$OUT/bench_fp4.md" > "$OUT/bench_fp4.log" 2>&1
head -12 "$OUT/bench_fp4.md" | cut -d'|' -f2,5,12,13,16
timeout 250 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 24576 6144 --profile > "$OUT/e2e.log" 2>&1
tail -5 "$OUT/e2e.log" | cut -c1-160
