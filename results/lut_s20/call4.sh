#!/usr/bin/env bash
# Session 20, call 4: down 24576 with A_RESIDENT and bf16 rows (BM128 BN128, 2 stages, 4 decode warps):
# decode-partition registers 120 / 136 / 152, then ncu's stall samples per SASS instruction.
#   OUT=/tmp/out bash results/lut_s20/call4.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C='{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4, "A_RESIDENT": 1}'
for r in 136 120 152 136; do
  timeout 100 python benchmarks/ws_ablation.py --gemm down --config "$C" --variant bf16_out --decode-regs $r \
    >> "$OUT/regs.log" 2>&1
done
grep -o '"decode_regs.*' "$OUT/regs.log"
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters"
timeout 150 ncu --clock-control none -k regex:fp4_wgmma_ws --launch-count 1 $S -o /root/ws python \
  benchmarks/ws_ablation.py --gemm down --config "$C" --variant bf16_out > "$OUT/ncu_run.log" 2>&1
ncu -i /root/ws.ncu-rep --page source --csv --print-source sass > /root/src.csv 2> "$OUT/src_err.txt"
gzip -c /root/src.csv > "$OUT/src.csv.gz"
ncu -i /root/ws.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
grep -E "Duration|Issued Warp|L1/TEX Cache|DRAM Throughput|Memory Throughput" "$OUT/ncu_details.txt" | head -6
