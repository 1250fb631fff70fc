"""Row maxima stored with the weights (``moetune.quant.scale_row_max``, ``fp4_prefill_moe``'s
``w13_scale_max`` / ``w2_scale_max``): the Gluon kernels read them instead of passing over each tile's scales.

On the CPU: the helper, the layer's checks of the tensors, the same output with and without them on the
Triton path (which makes its own), and an offline sm_90 compile of every Gluon kernel reading them. On a GPU
(``gpu`` tests): each Gluon kernel's rows with the stored maxima are those of the pass, bit for bit."""

import json
import os
import subprocess
import sys

import pytest
import torch

from moetune.kernels.fp4_prefill.config import GLUON_FIXED, normalize_config
from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.quant import pad_mxfp4_k, quantize_mxfp4, scale_row_max
from moetune.routing import make_routes

RING = {"IMPL": "gluon", **GLUON_FIXED, "SWAP_AB": 1, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_warps": 4,
        "num_stages": 3, "GROUP_SIZE_M": 8, "SCALE_RING": 1, "RING_SPLIT": 1}
SMEM = {**RING, "SWAP_AB": 0, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "SCALE_RING": 0, "RING_SPLIT": 0,
        "num_stages": 2}
WS = {**SMEM, "BLOCK_SIZE_M": 128, "num_warps": 8, "DECODE_WARPS": 4}
# each Gluon kernel once: the ring (SWAP_AB 1), the shared-memory loops, the warp-specialized one
CONFIGS = {"ring": RING, "ring-resident": {**RING, "A_RESIDENT": 1}, "smem": SMEM,
           "smem-halves": {**SMEM, "MMA_HALVES": 1, "num_stages": 3}, "ws": WS,
           "ws-resident-bf16": {**WS, "A_RESIDENT": 1, "GROUP_SIZE_M": 1, "OUT_DTYPE": "bf16"}}


def test_scale_row_max_is_each_rows_largest_code():
    scale = torch.tensor([[[3, 9, 1], [0, 0, 0]], [[255, 2, 7], [5, 6, 4]]], dtype=torch.uint8)
    got = scale_row_max(scale)
    assert got.dtype == torch.uint8 and got.is_contiguous()
    assert got.tolist() == [[9, 0], [255, 6]]
    assert scale_row_max(scale[:, :, :2]).tolist() == [[9, 0], [255, 6]]  # a view's rows
    for bad, what in ((scale.float(), "uint8"), (scale[0, 0], r"\[\.\.\., N, K/32\]"), ([1, 2], "list"),
                      (scale[..., :0], "no scale groups")):
        with pytest.raises(ValueError, match=what):
            scale_row_max(bad)


def test_padding_along_k_keeps_each_rows_largest_code():
    """pad_mxfp4_k's scale codes are the row's own maximum, so the fp8 re-basing of the real groups is that
    of the unpadded weights."""
    g = torch.Generator().manual_seed(2)
    packed, scale = quantize_mxfp4(torch.randn(3, 8, 160, generator=g) * 0.05)
    assert scale.max() < 127  # small weights: a padding at 2^0 would have raised every row's maximum
    pp, ps = pad_mxfp4_k(packed, scale, 256)
    assert torch.equal(scale_row_max(ps), scale_row_max(scale))
    assert (ps[..., 5:] == scale_row_max(scale)[..., None]).all()


def _layer_args(seed=0, m=24, h=128, i=64, e=4, top_k=2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)
    ids, wts = make_routes(m, top_k, e, routing="zipf:1.2", active_fraction=0.75, generator=g)
    return x, *w13, *w2, wts, ids


CPU_CONFIG = {"gate_up": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64},
              "down": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32}}


def test_the_layer_gives_the_same_output_with_the_maxima():
    """On the CPU the Triton kernels run, which make their own maxima: the result is the same bytes, checked
    values included (``validate``), through the layer and the torch op."""
    from moetune.ops import fp4_prefill_moe as op

    args = _layer_args()
    smax = {"w13_scale_max": scale_row_max(args[2]), "w2_scale_max": scale_row_max(args[4])}
    plain = fp4_prefill_moe(*args, config=CPU_CONFIG)
    assert torch.equal(fp4_prefill_moe(*args, config=CPU_CONFIG, validate=True, **smax), plain)
    assert torch.equal(op(*args, config=CPU_CONFIG, **smax), plain)


def test_the_layer_checks_the_maxima():
    args = _layer_args()
    good = scale_row_max(args[2])
    cases = {"dtype": good.int(), "must be a contiguous": good[:, :-1], "2-D": good[None],
             "share a device": good.to("meta")}
    for what, bad in cases.items():
        with pytest.raises(ValueError, match=what):
            fp4_prefill_moe(*args, config=CPU_CONFIG, w13_scale_max=bad)
    with pytest.raises(ValueError, match="must be a contiguous"):  # transposed: strides, not the shape
        fp4_prefill_moe(*args, config=CPU_CONFIG, w2_scale_max=scale_row_max(args[4]).T.contiguous().T)
    wrong = good.clone()
    wrong[1, 3] -= 1
    fp4_prefill_moe(*args, config=CPU_CONFIG, w13_scale_max=wrong)  # values: only validate checks them
    with pytest.raises(ValueError, match="w13_scale_max is not the scale's row maxima"):
        fp4_prefill_moe(*args, config=CPU_CONFIG, w13_scale_max=wrong, validate=True)


_COMPILE = r"""
import json, re, sys
from moetune.kernels.fp4_prefill.gluon_gemm import compile_for_sm90
out = {}
for name, cfg in json.loads(sys.argv[1]).items():
    got = {}
    for row_max in (False, True):
        k = compile_for_sm90(cfg, n=4096 - 32, out_dtype=cfg.get("OUT_DTYPE", "fp32"), row_max=row_max)
        ptx = k.asm["ptx"]
        got[str(row_max)] = {"async": "wgmma.mma_async" in ptx, "shared": k.metadata.shared,
                             "byte_loads": len(re.findall(r"ld\.global(?:\.[a-z]+)*\.b8", ptx))}
    out[name] = got
print(json.dumps(out))
"""


def test_every_gluon_kernel_compiles_reading_the_maxima():
    """Offline compile (no GPU, no TRITON_INTERPRET) with a tail N tile, with and without the stored maxima:
    both issue the wgmma async and allocate the same shared memory; the stored maxima replace the pass's
    byte loads of scale codes (a loop of eight) by the one of the maxima, so the PTX holds fewer, except in
    the resident warp-specialized tile, which keeps the pass."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(CONFIGS)], capture_output=True,
                         text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    for name, got in json.loads(run.stdout.strip().splitlines()[-1]).items():
        plain, stored = got["False"], got["True"]
        assert plain["async"] and stored["async"], name
        assert stored["shared"] == plain["shared"], name
        if name == "ws-resident-bf16":  # keeps the pass, faster there (gluon_ws._ws_decode)
            assert stored["byte_loads"] == plain["byte_loads"], name
        else:
            assert 0 < stored["byte_loads"] < plain["byte_loads"], name


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n", [1024, 1024 - 32])
def test_stored_maxima_give_the_rows_of_the_pass_on_gpu(name, n):
    """grouped_gemm with and without the stored maxima, bit for bit (N whole tiles and with a tail tile, whose
    rows past N read row N - 1's maximum); skewed, partly inactive routes, rows NaN-poisoned beforehand."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import OUT_DTYPES, grouped_gemm
    from moetune.quant import quantize_fp8_act

    cfg = normalize_config(CONFIGS[name], "down")
    e, k, tokens, top_k = 16, 1024, 512, 4
    g = torch.Generator().manual_seed(n)
    ids, _ = make_routes(tokens, top_k, e, routing="zipf:1.1", active_fraction=0.9, generator=g,
                         device="cuda")
    w, ws = (t.cuda() for t in quantize_mxfp4(torch.randn(e, n, k, generator=g) * 0.05))
    ws[:, :, 5] += torch.randint(0, 4, ws.shape[:2], dtype=torch.uint8, device="cuda")  # maxima mid-row
    q, s = quantize_fp8_act(torch.randn(tokens, k, generator=g).cuda(), k_order="wgmma")
    align = align_routes(ids, e, cfg["BLOCK_SIZE_M"])
    rows = []
    for smax in (None, scale_row_max(ws)):
        out = torch.full((tokens * top_k, n), float("nan"), dtype=OUT_DTYPES[cfg["OUT_DTYPE"]], device="cuda")
        grouped_gemm(q, s, w, ws, out, align, a_div=top_k, config=cfg, a_k_order="wgmma", w_scale_max=smax)
        rows.append(out[ids.flatten() >= 0])
    assert torch.isfinite(rows[0]).all() and rows[0].abs().sum() > 0
    assert torch.equal(rows[1], rows[0])
