#!/usr/bin/env bash
# Session 18, call 7: ncu of DECODE_WARPS 8 (BM128 BN128, 8 MMA warps + 8 decode warps, 3 stages) at 24576
# routes, its first launch (gate/up): where the chunk time goes once decode and MMA are different warps.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters"
timeout 300 ncu --clock-control none -k regex:fp4_wgmma_ws --launch-count 1 $S python benchmarks/gluon_fp4.py \
  --out "$OUT/g" --routes 24576 --configs \
  '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "SWAP_AB": 0, "GROUP_SIZE_M": 1, "DECODE_WARPS": 8}' \
  > "$OUT/ncu_ws24576.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Issue Slots Busy|No Eligible|Stall|Throughput|Warp Cycles|Executed Ipc|SM Frequency" "$OUT/ncu_ws24576.txt" | cut -c1-150 | head -40
