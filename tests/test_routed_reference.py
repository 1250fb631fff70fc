"""The specs' shared reference GEMM: cached fp32 experts and chunked on-the-fly dequantization agree."""

from __future__ import annotations

import pytest
import torch

from moetune.quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from moetune.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from moetune.specs import _routed_reference as R


def _weights(kind, e, n, k):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(1))
    if kind == "fp8":
        q, s = quantize_fp8_block(w)
        return {"w": q, "w_scale": s}, dequantize_fp8_block
    q, s = quantize_mxfp4(w)
    return {"w": q, "w_scale": s}, dequantize_mxfp4


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
@pytest.mark.parametrize("row_div", [1, 2])
def test_cached_and_chunked_paths_match_a_route_by_route_product(monkeypatch, kind, row_div):
    e, n, k, routes = 6, 48, 160 if kind == "fp8" else 128, 10
    weights, dequant = _weights(kind, e, n, k)
    ids = torch.tensor([3, -1, 0, 3, 5, 5, -1, 1, 3, 0])  # repeats, gaps (experts 2 and 4), inactive routes
    a = torch.randn(routes // row_div, k, generator=torch.Generator().manual_seed(2))
    full = dequant(weights["w"], weights["w_scale"]).float()
    expect = torch.zeros(routes, n)
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
    assert calls == [2, 2]  # the 4 routed experts (0, 1, 3, 5), two at a time; experts 2 and 4 never read
