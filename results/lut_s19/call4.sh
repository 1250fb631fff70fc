#!/usr/bin/env bash
# Session 19, call 4: ablations of DECODE_WARPS (benchmarks/ws_ablation.py) at down / gate-up 24576 routes:
# the kernel without the table lookup, without the wgmma, without both.   OUT=/tmp/out bash results/lut_s19/call4.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for g in ${GEMMS:-down gate_up}; do
  timeout 280 python benchmarks/ws_ablation.py --all --gemm $g --routes 24576 > "$OUT/ablation_$g.log" 2>&1
  tail -9 "$OUT/ablation_$g.log" | cut -c1-300
done
