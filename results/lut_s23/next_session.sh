#!/usr/bin/env bash
# For the next session with device time (written in session 23, not run): the input quantizer in one Triton
# launch (`act_quant`, moetune/kernels/fp4_act.py), which fp4_prefill_moe now calls instead of torch's
# quantize_fp8_act. Its GPU tests (bit for bit against the torch quantizer, and the whole path against the
# reference), then the whole MoE end to end at TP 2 with both quantizers timed alone (session 23 before it:
# 0.803 / 1.045 / 2.124 ms at 1536 / 6144 / 24576 routes, lut_s23/call11/e2e.json). Last, gpt-oss-120b's
# experts as they are and zero-padded along K to 3072 (pad_mxfp4_k, so the Gluon tiles can run them;
# benchmarks/fp4_pad_k.py), each checked against the reference.
#   OUT=/tmp/out bash results/lut_s23/next_session.sh      (~4 minutes on one H200)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q tests/test_fp4_act.py tests/test_fp4_prefill.py \
  > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
timeout 150 python benchmarks/fp4_moe_e2e.py --out "$OUT" --routes 1536 6144 24576 > "$OUT/e2e.log" 2>&1
tail -6 "$OUT/e2e.log"
timeout 200 python benchmarks/fp4_pad_k.py --out "$OUT" --routes 1536 6144 24576 > "$OUT/pad_k.log" 2>&1
tail -9 "$OUT/pad_k.log"
