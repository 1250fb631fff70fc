#!/usr/bin/env bash
# Prepared in session 19 for the next device window (not run): where the ~0.78 ms of fp4_prefill_moe outside its
# two GEMMs goes at 24576 routes (2.363 ms whole against 0.994 + 0.587 ms of GEMMs in session 19's bench), and
# at 6144: each kernel's GPU time (torch.profiler).   OUT=/tmp/out bash results/lut_s19/next_session.sh  (~2 min)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 300 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 24576 6144 --profile > "$OUT/e2e.log" 2>&1
tail -30 "$OUT/e2e.log" | cut -c1-160
