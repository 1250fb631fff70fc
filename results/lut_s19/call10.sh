#!/usr/bin/env bash
# Session 19, call 10: the final DECODE_WARPS kernel at down 24576 (the table's pick: BM128 BN128 8 warps,
# 2 stages, GROUP_SIZE_M 1): every ablation, then ncu's stall samples a partition.
#   OUT=/tmp/out bash results/lut_s19/call10.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C='{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 2, "GROUP_SIZE_M": 1, "DECODE_WARPS": 4}'
timeout 300 python benchmarks/ws_ablation.py --all --gemm down --config "$C" > "$OUT/ablation.log" 2>&1
tail -11 "$OUT/ablation.log"
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters"
timeout 150 ncu --clock-control none -k regex:fp4_wgmma_ws --launch-count 1 $S -o /root/ws python \
  benchmarks/ws_ablation.py --gemm down --config "$C" > "$OUT/ncu_run.log" 2>&1
ncu -i /root/ws.ncu-rep --page source --csv --print-source sass > /root/src.csv 2> "$OUT/src_err.txt"
gzip -c /root/src.csv > "$OUT/src.csv.gz"
ncu -i /root/ws.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
grep -E "Duration|Issued Warp|L1/TEX Cache|DRAM Throughput" "$OUT/ncu_details.txt" | head -6
