"""The FP8 activation quantizers of the FP4 prefill path: the input's, and the fused swiglu + routing
weight + FP8 quantization between the GEMMs."""

import pytest
import torch

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp4_prefill.act_quant import act_quant, swiglu_quant
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


@pytest.mark.parametrize("k, group, k_order, dtype, strided", [
    (160, 128, "real", torch.bfloat16, False),  # a partial last group
    (384, 128, "wgmma", torch.float32, False),
    (96, 32, "real", torch.float16, True),
    (256, 128, "wgmma", torch.bfloat16, True),
])
def test_act_quant_is_the_torch_quantizer_bit_for_bit(k, group, k_order, dtype, strided, device):
    g = torch.Generator().manual_seed(k + group)
    rows = 7
    # magnitudes over many binades (ties, e4m3 subnormals, the 1e-4 amax floor), one row all zero
    x = torch.randn(rows, k, generator=g) * torch.logspace(-9, 3, rows)[:, None]
    x[3] = 0.0
    x = x.to(dtype).to(device)
    if strided:  # every other column of a wider buffer, and a column-major copy
        wide = torch.zeros(rows, 2 * k, dtype=dtype, device=device)
        wide[:, ::2] = x
        x = wide[:, ::2] if k_order == "real" else x.t().contiguous().t()
        assert not x.is_contiguous()
    q, s = act_quant(x, group, k_order=k_order)
    q_ref, s_ref = quantize_fp8_act(x, group, k_order=k_order)
    assert q.shape == q_ref.shape and s.shape == s_ref.shape == (rows, -(-k // group))
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_act_quant_empty_and_bad_input():
    q, s = act_quant(torch.empty(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    for kwargs, match in (({"group": 96}, "group"), ({"k_order": "wgmma", "group": 64}, "k_order"),
                          ({"k_order": "tiled"}, "k_order")):
        with pytest.raises(ValueError, match=match):
            act_quant(torch.zeros(2, 256), **kwargs)
    with pytest.raises(ValueError, match="width a multiple of 128"):
        act_quant(torch.zeros(2, 160), k_order="wgmma")
    with pytest.raises(ValueError, match="width"):
        act_quant(torch.zeros(2, 160), width=128)
    with pytest.raises(ValueError, match="x"):
        act_quant(torch.zeros(2, 256, dtype=torch.int32))


@pytest.mark.parametrize("k_order", ["real", "wgmma"])
def test_padded_widths_are_the_zero_padded_rows_quantized(k_order, device):
    """``width`` past K (weights zero-padded along K): both quantizers write the zero-padded rows' numbers."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 160, generator=g) * 3).to(device)
    q, s = act_quant(x, k_order=k_order, width=384)
    q_ref, s_ref = quantize_fp8_act(torch.nn.functional.pad(x, (0, 224)), k_order=k_order)
    assert q.shape == (5, 384) and torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))

    gu = torch.randn(4, 2 * 160, generator=g).to(device)
    w = torch.rand(4, generator=g).to(device)
    ids = torch.tensor([0, -1, 2, 1], dtype=torch.int32, device=device)
    q, s = swiglu_quant(gu, w, ids, None, k_order=k_order, width=256)
    q_real, s_real = swiglu_quant(gu, w, ids, None)
    act = ids >= 0
    assert q.shape == (4, 256) and s.shape == (4, 2)
    assert torch.equal(s[act], s_real[act])
    unpermuted = (q[act] if k_order == "real" else _from_wgmma(q[act])).view(torch.uint8)
    assert torch.equal(unpermuted[:, :160], q_real[act].view(torch.uint8))
    assert (unpermuted[:, 160:] == 0).all()
    with pytest.raises(ValueError, match="width"):
        swiglu_quant(gu, w, ids, None, width=100)


def _from_wgmma(q):
    """The inverse of ``to_wgmma_k_order`` (real K order back), as uint8."""
    rows, k = q.shape
    u = q.view(torch.uint8).reshape(rows, k // 128, 4, 2, 4, 4)  # [row, chunk, b, h, q, i]
    return u.permute(0, 1, 4, 2, 3, 5).reshape(rows, k).view(torch.float8_e4m3fn)


def test_quantizers_compile_for_sm90_with_the_hardware_e4m3_conversion():
    """What the GPU runs (compiled for sm_90 without a GPU): both quantizers, both K orders, convert with
    the hardware's round-to-nearest saturating cvt, which the CPU tests stand in for with _round_to_e4m3."""
    from sm90_compile import compile_sm90

    common = {"GROUP": 128, "ROUND_FIRST": False, "stride_xk": 1}
    jobs = []
    for order in (False, True):
        jobs.append({"kernel": "moetune.kernels.fp4_prefill.act_quant._act_quant_kernel",
                     "const": {**common, "WGMMA_ORDER": order},
                     "types": {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"},
                     "options": {"num_warps": 4}})
        for bias in (False, True):  # without a bias the launcher passes b_ptr None (a constexpr)
            jobs.append({"kernel": "moetune.kernels.fp4_prefill.act_quant._swiglu_quant_kernel",
                         "const": {"GROUP": 128, "ROUND_FIRST": False, "HAS_LIMIT": True,
                                   "WGMMA_ORDER": order, "ACTIVATION": 0, "HAS_BIAS": bias,
                                   **({} if bias else {"b_ptr": None})},
                         "types": {"gu_ptr": "*fp32", "w_ptr": "*fp32", "ids_ptr": "*i32", "b_ptr": "*bf16",
                                   "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "limit": "fp32"},
                         "options": {"num_warps": 4}})
    got = compile_sm90(jobs)
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    assert len(got) == 6
    for g in got:
        assert "cvt.rn.satfinite.e4m3x2.f32" in g["ptx"]
