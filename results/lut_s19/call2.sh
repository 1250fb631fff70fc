#!/usr/bin/env bash
# Session 19, call 2: DECODE_WARPS with the next tile's ids loaded a tile ahead and the row max scales from the
# launcher (rmax [E, N]): GPU tests, then timings at 18432 / 24576 routes.   OUT=/tmp/out bash results/lut_s19/call2.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MOETUNE_TEST_GPU=1 timeout 200 python -m pytest -q tests/test_fp4_wgmma.py -k "variants" > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep -E "^FAILED|^E  " "$OUT/gpu_tests.log" | head -20
python - <<'PY' 2>&1 | tee "$OUT/amax.txt"
import torch, triton
for e, n, k in [(256, 4096, 1024), (256, 2048, 4096)]:
    s = torch.randint(100, 130, (e, n, k // 32), dtype=torch.uint8, device="cuda")
    print(f"amax of w_scale {tuple(s.shape)}: {triton.testing.do_bench_cudagraph(lambda: s.amax(dim=2)) * 1e3:.1f} us")
PY
S='"SWAP_AB": 0, "DECODE_WARPS": 4, "BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8'
timeout 300 python benchmarks/gluon_fp4.py --out "$OUT/g" --routes 18432 24576 --configs \
  "{$S, \"num_stages\": 2, \"GROUP_SIZE_M\": 8}" "{$S, \"num_stages\": 3, \"GROUP_SIZE_M\": 8}" \
  "{$S, \"num_stages\": 4, \"GROUP_SIZE_M\": 8}" "{$S, \"num_stages\": 3, \"GROUP_SIZE_M\": 1}" > "$OUT/gluon.log" 2>&1
tail -22 "$OUT/gluon.log"
