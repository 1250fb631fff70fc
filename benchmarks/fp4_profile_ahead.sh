#!/usr/bin/env bash
# Session 15, issue 5: ncu of the fp4 picks at 6144 / 24576 routes with SCALE_AHEAD / A_QUADS, then a coordinate
# polish of the tables at those densities with the two switches in the space. OUT=/tmp/out bash benchmarks/fp4_profile_ahead.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T6='{"BLOCK_SIZE_M":32,"BLOCK_SIZE_N":256,"BLOCK_SIZE_K":64,"GROUP_SIZE_M":16,"DECODE":"fp8","UNPACK":"lut","SWAP_AB":1,"W_TMA":1,"num_stages":3,"num_warps":4'
T24='{"BLOCK_SIZE_M":128,"BLOCK_SIZE_N":64,"BLOCK_SIZE_K":128,"GROUP_SIZE_M":8,"DECODE":"fp8_row","UNPACK":"lut","num_stages":3,"num_warps":8'
H24='{"BLOCK_SIZE_M":128,"BLOCK_SIZE_N":64,"BLOCK_SIZE_K":128,"GROUP_SIZE_M":8,"DECODE":"fp8","UNPACK":"halves","num_stages":3,"num_warps":4}'
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats"
N="ncu --clock-control none --nvtx --nvtx-include cfg0/ --nvtx-include cfg1/ --nvtx-include cfg2/ -k regex:fp4_moe_gemm --launch-count 3 $S"
timeout 150 $N python benchmarks/profile_configs.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 --routes 6144 --launches 1 --config "$T6}" --config "$T6,\"SCALE_AHEAD\":1}" --config "$T6,\"A_QUADS\":1}" > $OUT/ncu_gu6144.txt 2>&1
timeout 150 $N python benchmarks/profile_configs.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 --routes 24576 --launches 1 --config "$H24" --config "$T24}" --config "$T24,\"SCALE_AHEAD\":1}" > $OUT/ncu_gu24576.txt 2>&1
grep -E "^cfg|Duration|Registers Per|Achieved Occ|Issue Slots Busy|No Eligible|Stall|DRAM Through" $OUT/ncu_gu*.txt | cut -c1-150 | head -60
ROUTES=6144,12288,24576 OUT=$OUT/p DB=/root/polish.sqlite BUDGET=24 LIMIT=260 bash benchmarks/h200_tables.sh polish pack > $OUT/polish.log 2>&1; tail -5 $OUT/polish.log
