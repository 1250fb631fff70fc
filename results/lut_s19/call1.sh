#!/usr/bin/env bash
# Session 19, call 1: per-instruction stall samples (ncu SourceCounters) of the down 24576 pick (DECODE_WARPS 4,
# BM128 BN128, 8 MMA warps, 3 stages): which partition waits, on what.   OUT=/tmp/out bash results/lut_s19/call1.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters"
timeout 300 ncu --clock-control none -k regex:fp4_wgmma_ws --launch-count 1 $S -o /root/ws python benchmarks/gluon_fp4.py \
  --out /root/g --gemms down --routes 24576 --configs \
  '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "SWAP_AB": 0, "GROUP_SIZE_M": 8, "DECODE_WARPS": 4}' \
  > "$OUT/ncu_run.log" 2>&1
tail -3 "$OUT/ncu_run.log"
ncu -i /root/ws.ncu-rep --page details > "$OUT/ncu_details.txt" 2>&1
ncu -i /root/ws.ncu-rep --page source --csv --print-source sass > /root/src.csv 2> "$OUT/src_err.txt"
gzip -c /root/src.csv > "$OUT/src.csv.gz"
head -c 600 "$OUT/src_err.txt"
python benchmarks/ncu_hotspots.py /root/src.csv --top 45 --ranges 0x0-0x44b0 0x44c0-0x9999 > "$OUT/hotspots.txt" 2>&1
grep -E "Duration|Issued Warp|No Eligible|Throughput|Bank|Shared|Pipe|Tensor|wavefront" "$OUT/ncu_details.txt" | cut -c1-140 | head -40
cut -c1-200 "$OUT/hotspots.txt" | head -60
