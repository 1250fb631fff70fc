"""IMPL "gluon" with N not a multiple of BLOCK_SIZE_N (gpt-oss-120b's N 2880 at 128- and 256-wide tiles): the
last N tile is a tail, its weight rows past N clamped to row N - 1 and its columns past N never stored.

On the CPU: the EVEN_N specialization the launcher picks and an offline sm_90 compile of the tail path of
every Gluon kernel (the weights still copied 16 bytes at a time). On a GPU (``gpu`` tests): the GEMM at
tail shapes against the reference, the output's columns past N untouched."""

import json
import os
import subprocess
import sys

import pytest
import torch

from moetune.kernels.fp4_prefill.config import GLUON_FIXED, normalize_config

SWAP = {"IMPL": "gluon", **GLUON_FIXED, "SWAP_AB": 1, "BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4,
        "num_stages": 3, "GROUP_SIZE_M": 8}
SMEM = {**SWAP, "SWAP_AB": 0, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_stages": 2}
WS = {**SMEM, "BLOCK_SIZE_M": 128, "num_warps": 8, "DECODE_WARPS": 4}
# one of each kernel and of the switches that change its tile loop or epilogue
CONFIGS = {
    "swap": SWAP,
    "swap-split": {**SWAP, "SCALE_RING": 1, "RING_SPLIT": 1},
    "swap-resident": {**SWAP, "BLOCK_SIZE_M": 16, "SCALE_RING": 1, "A_RESIDENT": 1},
    "swap-bn128": {**SWAP, "BLOCK_SIZE_N": 128, "num_warps": 8, "SCALE_RING": 1},
    "smem": SMEM,
    "smem-scale-ring-bn256": {**SMEM, "BLOCK_SIZE_N": 256, "SCALE_RING": 1},
    "smem-halves": {**SMEM, "MMA_HALVES": 1, "num_stages": 3},
    "ws": WS,
    "ws-resident-bf16": {**WS, "A_RESIDENT": 1, "GROUP_SIZE_M": 1, "OUT_DTYPE": "bf16"},
    "ws-tma": {**WS, "W_TMA": 1},
}


def test_launcher_specializes_on_whole_n_tiles():
    from moetune.kernels.fp4_prefill.gluon_gemm import _kernel, n_tiles, resident_n_tiles

    for cfg in CONFIGS.values():
        cfg = normalize_config(cfg, "down")
        bn = cfg["BLOCK_SIZE_N"]
        assert _kernel(cfg, 1, False, 1024, 4096)[1]["EVEN_N"] is True
        assert _kernel(cfg, 1, False, 1024, 2880)[1]["EVEN_N"] is (2880 % bn == 0)
        assert _kernel(cfg, 1, False, 1024, 4096 + 32)[1]["EVEN_N"] is False
    assert [n_tiles(2880, bn) for bn in (64, 128, 256)] == [45, 23, 12]
    # A_RESIDENT's run of N tiles divides the tiles, a tail tile counted: 352 / 64 = 5.5 -> 6 tiles, runs of 2
    assert [resident_n_tiles(n, 64) for n in (352, 320, 4096, 4096 + 32)] == [2, 1, 4, 1]


_COMPILE = r"""
import json, re, sys
from moetune.kernels.fp4_prefill.gluon_gemm import compile_for_sm90
out = {}
for name, cfg in json.loads(sys.argv[1]).items():
    got = {}
    for n in (4096, 4096 - 32):
        k = compile_for_sm90(cfg, n=n, out_dtype=cfg.get("OUT_DTYPE", "fp32"))
        ptx = k.asm["ptx"].split(".section\t.debug")[0]
        ptx = re.sub(r"^\s*\.loc.*$|^\s*\$L__tmp\d+:$", "", ptx, flags=re.M)  # source lines only
        copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10, 0x10;", ptx)
        got[n] = {"ptx": ptx, "async": "isAsync = true" in k.asm["ttgir"], "shared": k.metadata.shared,
                  "copies16": len(copies), "tma": len(re.findall(r"cp\.async\.bulk\.tensor", ptx))}
    out[name] = got
print(json.dumps(out))
"""


def test_tail_tiles_compile_for_sm90():
    """Offline compile (no GPU, no TRITON_INTERPRET) of each kernel at N 4096 (whole tiles) and 4064 (a tail
    at every tile width, A_RESIDENT's runs of 4 N tiles kept): both issue the wgmma async; the tail path
    differs (its clamps and column masks), allocates the same shared memory and still copies the packed
    weights as whole 16-byte words (W_TMA: by the same TMA copies)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(CONFIGS)], capture_output=True,
                         text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for name, by_n in got.items():
        even, tail = by_n["4096"], by_n["4064"]
        assert even["async"] and tail["async"], name
        assert "wgmma.mma_async" in tail["ptx"], name
        assert tail["ptx"] != even["ptx"], name
        assert tail["shared"] == even["shared"], name
        if CONFIGS[name].get("W_TMA"):  # the packed weights by TMA, the tail's rows past N zero-filled
            assert tail["tma"] == even["tma"] > 0, name
        else:
            assert tail["copies16"] == even["copies16"] > 0, name


def _reference(q, s, w, ws, ids, a_div):
    """out[r] = dequant(a[r // a_div]) @ dequant(w[expert(r)]).T for active routes, in fp64."""
    from moetune.quant.fp8_act import dequantize_fp8_act
    from moetune.quant.mxfp4 import dequantize_mxfp4

    a = dequantize_fp8_act(q, s).double()
    flat = ids.flatten()
    ref = torch.zeros(flat.numel(), w.shape[1], dtype=torch.float64, device=q.device)
    for e in range(w.shape[0]):
        rows = (flat == e).nonzero().flatten()
        if rows.numel():
            ref[rows] = a[rows // a_div] @ dequantize_mxfp4(w[e], ws[e]).double().T
    return ref


@pytest.mark.gpu
@pytest.mark.parametrize("name, n", [
    ("swap", 352), ("swap-split", 352), ("swap-resident", 352), ("swap-bn128", 320), ("smem", 320),
    ("smem-scale-ring-bn256", 320), ("smem-halves", 320), ("ws", 320), ("ws-resident-bf16", 320),
    ("ws-tma", 320), ("smem", 2880), ("ws", 2880), ("ws-tma", 2880)])
def test_tail_tile_matches_reference_on_gpu(device, name, n):
    """grouped_gemm at N with a tail tile (352 = 5.5 x 64, 320 = 2.5 x 128 = 1.25 x 256, gpt-oss's 2880 =
    22.5 x 128) against the fp64 reference, whole and in the tail tile's columns alone; the output a view of
    a wider poisoned buffer, whose columns past N no store may touch; skewed, partly inactive routes."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import quantize_fp8_act, quantize_mxfp4
    from moetune.routing import make_routes

    cfg = normalize_config(CONFIGS[name], "down")
    e, k, tokens, top_k = 8, 512, 256, 2
    g = torch.Generator().manual_seed(n)
    ids, _ = make_routes(tokens, top_k, e, routing="zipf:1.1", active_fraction=0.9, generator=g,
                         device=device)
    ids[0, 0] = e - 1
    w, ws = (t.to(device) for t in quantize_mxfp4(torch.randn(e, n, k, generator=g) * 0.05))
    q, s = quantize_fp8_act(torch.randn(tokens, k, generator=g).to(device))
    align = align_routes(ids, e, cfg["BLOCK_SIZE_M"])
    dtype = torch.bfloat16 if cfg["OUT_DTYPE"] == "bf16" else torch.float32
    poison = -7.0  # exact in both dtypes
    wide = torch.full((tokens * top_k, n + 64), poison, dtype=dtype, device=device)
    grouped_gemm(q, s, w, ws, wide[:, :n], align, a_div=top_k, config=cfg)
    active = ids.flatten() >= 0
    assert (wide[:, n:] == poison).all()
    out, ref = wide[active, :n].double(), _reference(q, s, w, ws, ids, top_k)[active]
    assert torch.isfinite(out).all()
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    tail = n - n % cfg["BLOCK_SIZE_N"]
    for cols in (slice(0, n), slice(tail, n)):
        err = (out[:, cols] - ref[:, cols]).norm() / ref[:, cols].norm()
        assert err.item() < tol, (name, cols, err.item())


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [SMEM, {**CONFIGS["swap-bn128"], "RING_SPLIT": 1},
                                 {**WS, "OUT_DTYPE": "bf16"}], ids=["smem", "swap-split-bn128", "ws"])
def test_gpt_oss_shaped_layer_with_tails_on_gpu(device, cfg):
    """fp4_prefill_moe scaled down from gpt-oss-120b: hidden 320 (down's N, 2.5 tiles of 128; gate/up's K,
    zero-padded to 512) and intermediate 160 (gate/up's N 320; down's K, padded to 256), swiglu with its
    limit; IMPL gluon for both GEMMs against the reference of the unpadded weights."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.quant import pad_mxfp4_k, quantize_mxfp4
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(3)
    m, h, i, e = 96, 320, 160, 8
    x = torch.randn(m, h, generator=g).to(torch.bfloat16).to(device)
    w13 = [t.to(device) for t in quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)]
    w2 = [t.to(device) for t in quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)]
    ids, wts = make_routes(m, 4, e, routing="zipf:1.2", active_fraction=0.75, generator=g, device=device)
    act = {"activation": "swiglu", "swiglu_limit": 7.0}
    config = {"gate_up": {k: v for k, v in cfg.items() if k != "OUT_DTYPE"}, "down": cfg}
    out = fp4_prefill_moe(x, *pad_mxfp4_k(*w13, 512), *pad_mxfp4_k(*w2, 256), wts, ids, config=config, **act)
    ref = fp4_prefill_moe_reference(x, *w13, *w2, wts, ids, **act)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref.double()).norm() / ref.double().norm()).item() < 1e-2
