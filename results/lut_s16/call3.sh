#!/usr/bin/env bash
# Session 16, last device call: ncu of the Gluon prototype's best 6144-route tile (the Triton pick's profile at the
# same point is results/lut_s15/ncu_gu6144.txt), then the fp4 bench at the points with the final tables.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats"
timeout 200 ncu --clock-control none -k regex:fp4_wgmma --launch-count 1 $S python benchmarks/gluon_fp4.py --bench \
  --out "$OUT/g" --routes 6144 --configs '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "num_warps": 4}' > "$OUT/ncu_gluon6144.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Issue Slots Busy|No Eligible|Stall|DRAM Through|Warp Cycles" "$OUT/ncu_gluon6144.txt" | cut -c1-150 | head -30
python -m moetune bench -m deepseek-v4-flash --tp 2 -k fp4_prefill --routes 1536,6144,24576 --csv "$OUT/bench_fp4_s16.csv" \
  --markdown "$OUT/bench_fp4_s16.md" > "$OUT/bench_fp4.log" 2>&1
cat "$OUT/bench_fp4_s16.md" | head -20
