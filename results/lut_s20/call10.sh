#!/usr/bin/env bash
# Session 20, call 10: A_RESIDENT for the SWAP_AB 1 kernel (a program's N tiles share its M-block's activations):
# the GPU tests, then down 6144 (the table's pick, BM32 BN64 SCALE_RING 1) and 1536 (BM16) with it, N tiles a
# program 2 / 4 / 8, each variant in its own process (ws_ablation, nothing ablated).
#   OUT=/tmp/out bash results/lut_s20/call10.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q -m gpu tests/test_fp4_wgmma.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -10
P='"num_warps": 4, "num_stages": 3, "GROUP_SIZE_M": 8, "SWAP_AB": 1, "SCALE_RING": 1'
for r in 6144 1536; do
  bm=32; [ $r = 1536 ] && bm=16
  C="{\"BLOCK_SIZE_M\": $bm, \"BLOCK_SIZE_N\": 64, $P}"
  CR="{\"BLOCK_SIZE_M\": $bm, \"BLOCK_SIZE_N\": 64, $P, \"A_RESIDENT\": 1}"
  timeout 60 python benchmarks/ws_ablation.py --gemm down --routes $r --config "$C" >> "$OUT/timing.log" 2>&1
  for t in 2 4 8; do
    timeout 60 python benchmarks/ws_ablation.py --gemm down --routes $r --config "$CR" --resident-tiles $t \
      >> "$OUT/timing.log" 2>&1
  done
  timeout 60 python benchmarks/ws_ablation.py --gemm down --routes $r --config "$C" >> "$OUT/timing.log" 2>&1
done
python - "$OUT/timing.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(r["routes"], r["config"].get("A_RESIDENT", 0), r.get("resident_tiles"), r["us"])
PY
