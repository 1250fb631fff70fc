"""The specs' shared reference GEMM: cached fp32 experts and chunked on-the-fly dequantization agree."""

from __future__ import annotations

import pytest
import torch

from moetune.quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from moetune.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from moetune.specs import _routed_reference as R


def _weights(kind, e, n, k, device="cpu"):
    w = torch.randn(e, n, k, generator=torch.Generator(device).manual_seed(1), device=device)
    if kind == "fp8":
        q, s = quantize_fp8_block(w)
        return {"w": q, "w_scale": s}, dequantize_fp8_block
    q, s = quantize_mxfp4(w)
    return {"w": q, "w_scale": s}, dequantize_mxfp4


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
@pytest.mark.parametrize("row_div", [1, 2])
@pytest.mark.parametrize(("small", "chunks"), [(16, [2, 2]), (1, [2, 1, 1])])
def test_cached_and_chunked_paths_match_a_route_by_route_product(monkeypatch, kind, row_div, small, chunks,
                                                                  device):
    """Experts with few rows share a padded batched matmul, the others get their own (``small``: where
    the line is; 1 puts experts 0, 3 and 5 on their own and expert 1 in a batch)."""
    monkeypatch.setattr(R, "SMALL", small)
    e, n, k, routes = 6, 48, 160 if kind == "fp8" else 128, 10
    weights, dequant = _weights(kind, e, n, k, device)
    # repeats, gaps (experts 2 and 4), inactive routes
    ids = torch.tensor([3, -1, 0, 3, 5, 5, -1, 1, 3, 0], device=device)
    a = torch.randn(routes // row_div, k, generator=torch.Generator(device).manual_seed(2), device=device)
    full = dequant(weights["w"], weights["w_scale"]).float()
    expect = torch.zeros(routes, n, device=device)
    for r, i in enumerate(ids.tolist()):
        if i >= 0:
            expect[r] = a[r // row_div] @ full[i].T
    cached = R.routed_matmul(a, ids, row_div, dict(weights), dequant, n)
    monkeypatch.setattr(R, "CHUNK_BYTES", 4 * n * k * 2)  # two experts per dequantization call
    calls = []

    def counting(w, s):
        calls.append(w.shape[0])
        return dequant(w, s)

    chunked = R.routed_matmul(a, ids, row_div, {**weights, R.DQ_KEY: None}, counting, n)  # no fp32 copy
    assert torch.allclose(cached, expect, atol=1e-4) and torch.allclose(chunked, expect, atol=1e-4)
    assert not cached[ids < 0].any() and not chunked[ids < 0].any()
    assert calls == chunks  # the 4 routed experts (0, 1, 3, 5), two at a time; experts 2 and 4 never read


def test_fp4_reference_inputs_are_exact_in_tf32(device):
    """Why the fp4 spec's reference may run TF32 matmuls: its activations (e4m3 codes times power-of-two
    scales) and weights (e2m1 codes times UE8M0 scales) lose nothing when cut to TF32's 10 mantissa bits,
    so the products, accumulated in fp32, are the fp32 ones. fp8 block weights (times an fp32 scale) are
    not, and the fp8 spec keeps IEEE fp32."""
    from moetune.quant.fp8_act import dequantize_fp8_act, quantize_fp8_act

    def tf32(x):
        return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)

    gen = torch.Generator(device).manual_seed(3)
    x = torch.randn(64, 512, generator=gen, device=device)
    x = x * torch.logspace(-6, 3, 512, device=device)  # magnitudes over nine decades
    a = dequantize_fp8_act(*quantize_fp8_act(x))
    weights, dequant = _weights("fp4", 4, 64, 512, device)
    w = dequant(weights["w"], weights["w_scale"]).float()
    assert torch.equal(tf32(a), a) and torch.equal(tf32(w), w)
    fp8, fp8_dequant = _weights("fp8", 2, 128, 256, device)
    w8 = fp8_dequant(fp8["w"], fp8["w_scale"]).float()
    assert not torch.equal(tf32(w8), w8)


def test_the_tf32_switch_restores_torchs_setting():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with R._tf32(True):
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with R._tf32(False):
        assert matmul.fp32_precision == before
