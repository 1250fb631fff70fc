#!/usr/bin/env bash
# Prepared in session 20 for the next device window (not run): where down at 6144 routes spends its time, the
# one issue-5 point still on the 2x line (the table's pick: SWAP_AB 1 BM32 BN64, 4 warps, 3 stages, SCALE_RING 1;
# 0.267 ms against the 0.134 ms floor). ncu's stall samples per SASS instruction for the pick and, for contrast,
# its A_RESIDENT twin (13-15% slower, session 20 call 11).   OUT=/tmp/out bash results/lut_s20/next_session.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters"
P='"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "GROUP_SIZE_M": 8, "SWAP_AB": 1, "SCALE_RING": 1'
for v in ring resident; do
  C="{$P}"; [ $v = resident ] && C="{$P, \"A_RESIDENT\": 1}"
  timeout 150 ncu --clock-control none -k regex:fp4_wgmma_kernel --launch-count 1 $S -o /root/$v python \
    benchmarks/ws_ablation.py --gemm down --routes 6144 --config "$C" > "$OUT/ncu_run_$v.log" 2>&1
  ncu -i /root/$v.ncu-rep --page source --csv --print-source sass 2> /dev/null | gzip > "$OUT/src_$v.csv.gz"
  ncu -i /root/$v.ncu-rep --page details > "$OUT/details_$v.txt" 2>&1
  grep -E "Duration|Issued Warp|Achieved Occupancy|L2 Cache Throughput|DRAM Throughput" "$OUT/details_$v.txt"
done
