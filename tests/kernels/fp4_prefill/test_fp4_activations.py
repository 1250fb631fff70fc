"""The FP4 prefill path's gated activations (``activation=``: silu, gelu_tanh, gpt-oss's swiglu) in the fused
quantizer and the whole layer, against ``moetune.kernels.activations`` and the fp32 reference."""

import pytest
import torch

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp4_prefill.act_quant import swiglu_quant
from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
from moetune.quant import quantize_fp8_act, quantize_mxfp4
from moetune.routing import make_routes

LIMIT = 7.0  # gpt-oss's swiglu_limit


def _problem(m=24, h=128, i=64, e=4, top_k=2, x_scale=1.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, h, generator=g) * x_scale).to(torch.bfloat16).to(device)
    ids, wts = make_routes(m, top_k, e, generator=g, device=device)
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)
    return x, *(t.to(device) for t in (*w13, *w2)), wts, ids


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _cfg(bm, bn, bk, decode="fp8_scaled", unpack="join", **kw):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=4, DECODE=decode, UNPACK=unpack,
                **kw)


@pytest.mark.parametrize("activation, limit, inter", [
    ("swiglu", LIMIT, 160),  # a partial last group
    ("swiglu", None, 256),
    ("swiglu", 0.5, 64),
    ("gelu_tanh", None, 160),
    ("gelu_tanh", 3.0, 128),  # gelu_tanh takes no clamp
    ("silu", LIMIT, 160),
])
def test_quantizer_is_the_torch_activation_quantized(activation, limit, inter, device):
    g = torch.Generator().manual_seed(inter)
    routes = 9
    # magnitudes from 1e-3 to ~60: values on both sides of the clamp, scales over many binades
    gu = (torch.randn(routes, 2 * inter, generator=g) * torch.logspace(-3, 1.5, routes)[:, None]).to(device)
    w = torch.rand(routes, generator=g).to(device) + 0.1
    ids = torch.tensor([0, 3, -1, 1, 2, -1, 0, 5, 4], dtype=torch.int32, device=device)
    gu[ids < 0] = float("nan")  # inactive rows: storage that must not be read
    w[ids < 0] = float("nan")
    q, s = swiglu_quant(gu, w, ids, limit, activation=activation)
    assert q.shape == (routes, inter) and s.shape == (routes, -(-inter // 128))
    act = ids >= 0
    h = gated_activation(gu[act, :inter], gu[act, inter:], activation, limit) * w[act, None]
    q_ref, s_ref = quantize_fp8_act(h)
    assert torch.equal(s[act], s_ref)
    same = q[act].view(torch.uint8) == q_ref.view(torch.uint8)
    # exp may differ from torch by an ulp, which can move a value across an e4m3 rounding edge
    assert same.float().mean() > 0.999
    if limit is not None and activation != "gelu_tanh":  # the clamp changed the function here
        unclamped = gated_activation(gu[act, :inter], gu[act, inter:], activation) * w[act, None]
        assert not torch.allclose(h, unclamped)


@pytest.mark.parametrize("k_order", ["real", "wgmma"])
def test_swiglu_past_the_intermediate_is_zero(k_order, device):
    """swiglu(0, 0) = 0 * sigmoid(0) * (0 + 1) = 0: the padded columns (``width``) quantize to zeros, and
    the real columns match the unpadded call."""
    g = torch.Generator().manual_seed(5)
    gu = (torch.randn(4, 2 * 160, generator=g) * 10).to(device)
    w = torch.rand(4, generator=g).to(device)
    ids = torch.tensor([0, -1, 2, 1], dtype=torch.int32, device=device)
    q, s = swiglu_quant(gu, w, ids, LIMIT, k_order=k_order, width=256, activation="swiglu")
    q_real, s_real = swiglu_quant(gu, w, ids, LIMIT, activation="swiglu")
    act = ids >= 0
    assert torch.equal(s[act], s_real[act])
    u = q[act].view(torch.uint8)
    if k_order == "wgmma":  # back to real K order (the inverse of to_wgmma_k_order)
        u = u.reshape(-1, 2, 4, 2, 4, 4).permute(0, 1, 4, 2, 3, 5).reshape(-1, 256)
    assert torch.equal(u[:, :160], q_real[act].view(torch.uint8))
    assert (u[:, 160:] == 0).all()


@pytest.mark.parametrize("gate_up, down", [
    (_cfg(16, 64, 64), _cfg(16, 32, 32, "fp8")),
    (_cfg(32, 128, 128, "fp8_row", "halves", SWAP_AB=1), _cfg(64, 64, 64, "bf16", "asm")),
])
def test_layer_swiglu_matches_the_reference(gate_up, down, device):
    """gpt-oss's swiglu at its limit 7, with gate/up outputs well past the clamp (x scaled up)."""
    args = _problem(x_scale=30.0, device=device)
    config = {"gate_up": gate_up, "down": down}
    out = fp4_prefill_moe(*args, activation="swiglu", swiglu_limit=LIMIT, config=config)
    ref = fp4_prefill_moe_reference(*args, activation="swiglu", swiglu_limit=LIMIT)
    assert _rel(out, ref) < 1e-2
    # the clamp took effect, and swiglu is not silu
    assert _rel(ref, fp4_prefill_moe_reference(*args, activation="swiglu")) > 1e-2
    assert _rel(ref, fp4_prefill_moe_reference(*args, swiglu_limit=LIMIT)) > 1e-2


def test_layer_gelu_tanh_matches_the_reference(device):
    args = _problem(x_scale=5.0, device=device)
    cfg = _cfg(16, 64, 64, "fp8")
    out = fp4_prefill_moe(*args, activation="gelu_tanh", config={"gate_up": cfg, "down": cfg})
    ref = fp4_prefill_moe_reference(*args, activation="gelu_tanh")
    assert _rel(out, ref) < 1e-2
    assert _rel(ref, fp4_prefill_moe_reference(*args)) > 1e-2


def test_default_is_silu(device):
    args = _problem(x_scale=30.0, device=device)
    cfg = {"gate_up": _cfg(16, 64, 64), "down": _cfg(16, 32, 32, "fp8")}
    for limit in (None, LIMIT):
        out = fp4_prefill_moe(*args, swiglu_limit=limit, config=cfg)
        assert torch.equal(out, fp4_prefill_moe(*args, activation="silu", swiglu_limit=limit, config=cfg))
        ref = fp4_prefill_moe_reference(*args, swiglu_limit=limit)
        assert torch.equal(ref, fp4_prefill_moe_reference(*args, activation="silu", swiglu_limit=limit))
        assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("kwargs, what", [
    ({"activation": "relu"}, "'relu'"),
    ({"activation": "SwiGLU"}, "'SwiGLU'"),
    ({"activation": None}, "activation"),
    ({"swiglu_limit": -1}, "swiglu_limit"),
    ({"swiglu_limit": 0}, "swiglu_limit"),
    ({"swiglu_limit": float("nan")}, "swiglu_limit"),
    ({"swiglu_limit": float("inf")}, "swiglu_limit"),
    ({"swiglu_limit": "7"}, "swiglu_limit"),
    ({"activation": "swiglu", "swiglu_limit": -7.0}, "swiglu_limit"),
])
def test_bad_activation_or_limit(kwargs, what):
    args = _problem(m=4)
    with pytest.raises(ValueError, match=what):
        fp4_prefill_moe(*args, config={"gate_up": {}, "down": {}}, **kwargs)
    with pytest.raises(ValueError, match=what):
        fp4_prefill_moe_reference(*args, **kwargs)


def test_quantizer_refuses_an_unknown_activation():
    ids = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="'relu'"):
        swiglu_quant(torch.zeros(2, 256), torch.ones(2), ids, None, activation="relu")


def test_activations_compile_for_sm90():
    """gelu_tanh and swiglu (what the GPU runs, compiled for sm_90 without a GPU), both K orders: each its
    own binary, all with the hardware e4m3 conversion."""
    from sm90_compile import compile_sm90

    jobs = [{"kernel": "moetune.kernels.fp4_prefill.act_quant._swiglu_quant_kernel",
             "const": {"GROUP": 128, "ROUND_FIRST": False, "HAS_LIMIT": True, "WGMMA_ORDER": order,
                       "ACTIVATION": code, "HAS_BIAS": False, "b_ptr": None},
             "types": {"gu_ptr": "*fp32", "w_ptr": "*fp32", "ids_ptr": "*i32", "q_ptr": "*fp8e4nv",
                       "s_ptr": "*fp32", "limit": "fp32"},
             "options": {"num_warps": 4}}
            for code in (0, 1, 2) for order in (False, True)]
    got = compile_sm90(jobs)
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    assert len({g["cubin"] for g in got}) == 6
    for g in got:
        assert "cvt.rn.satfinite.e4m3x2.f32" in g["ptx"]
