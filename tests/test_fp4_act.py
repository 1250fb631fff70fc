"""The fused swiglu + routing weight + FP8 quantization between the FP4 prefill GEMMs."""

import pytest
import torch

from moetune.activations import gated_activation
from moetune.kernels.fp4_act import swiglu_quant
from moetune.quant import quantize_fp8_act


@pytest.mark.parametrize("inter, limit", [(160, None), (256, 0.5), (64, 3.0)])
def test_matches_torch_quantization_bit_for_bit(inter, limit, device):
    g = torch.Generator().manual_seed(inter)
    routes = 9
    # magnitudes over many binades, so scales and e4m3 rounding (ties, subnormals) all get exercised
    gu = (torch.randn(routes, 2 * inter, generator=g) * torch.logspace(-3, 2, routes)[:, None]).to(device)
    w = torch.rand(routes, generator=g).to(device) + 0.1
    ids = torch.tensor([0, 3, -1, 1, 2, -1, 0, 5, 4], dtype=torch.int32, device=device)
    gu[ids < 0] = float("nan")  # inactive rows: storage that must not be read
    w[ids < 0] = float("nan")
    q, s = swiglu_quant(gu, w, ids, limit)
    assert q.shape == (routes, inter) and s.shape == (routes, -(-inter // 128))
    act = ids >= 0
    h = gated_activation(gu[act, :inter], gu[act, inter:], "silu", limit) * w[act, None]
    q_ref, s_ref = quantize_fp8_act(h)
    assert torch.equal(s[act], s_ref)
    same = q[act].view(torch.uint8) == q_ref.view(torch.uint8)
    # silu's exp may differ from torch by an ulp, which can move a value across an e4m3 rounding edge
    assert same.float().mean() > 0.999


def test_zero_routes():
    q, s = swiglu_quant(torch.empty(0, 256), torch.empty(0), torch.empty(0, dtype=torch.int32), None)
    assert q.shape == (0, 128) and s.shape == (0, 1)
