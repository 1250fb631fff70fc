#!/usr/bin/env bash
# Session 17: ncu of the IMPL gluon SWAP_AB 0 kernel at 24576 routes, gate/up (BM128 BN64, 8 warps, 2 CTAs an SM).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters"
timeout 300 ncu --clock-control none -k regex:fp4_wgmma_smem --launch-count 1 $S python benchmarks/gluon_fp4.py \
  --out "$OUT/g" --routes 24576 --configs \
  '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "num_warps": 8, "num_stages": 2, "SWAP_AB": 0, "SCALE_RING": 1}' \
  > "$OUT/ncu_smem24576.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Issue Slots Busy|No Eligible|Stall|Throughput|Warp Cycles|Executed Ipc" "$OUT/ncu_smem24576.txt" | cut -c1-150 | head -40
