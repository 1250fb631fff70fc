"""The FP4 prefill path's optional expert biases (gpt-oss): the gate/up bias in the fused activation kernel,
the down bias (times the routing weight) in moe_sum, the whole layer against the fp32 reference."""

import pytest
import torch

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp4_prefill.act_quant import swiglu_quant
from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.kernels.fp4_prefill.moe_sum import moe_sum, moe_sum_reference
from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
from moetune.quant import pad_mxfp4_k, quantize_fp8_act, quantize_mxfp4
from moetune.routing import make_routes

LIMIT = 7.0  # gpt-oss's swiglu_limit
CFG = {"gate_up": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_warps=4, DECODE="fp8_scaled",
                       UNPACK="join"),
       "down": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, num_warps=4, DECODE="fp8",
                    UNPACK="join")}


def _problem(m=20, h=160, i=96, e=4, top_k=2, active=0.75, seed=0, device="cpu", bias_dtype=torch.bfloat16):
    """H 160, I 96: partial N tiles, partial K chunks and a partial last 128-group of the intermediate.
    Biases of gpt-oss's size (about 1), so they change the function."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)
    ids, wts = make_routes(m, top_k, e, active_fraction=active, generator=g)
    b13 = torch.randn(e, 2 * i, generator=g).to(bias_dtype)
    b2 = torch.randn(e, h, generator=g).to(bias_dtype)
    return [t.to(device) for t in (x, *w13, *w2, wts, ids)], b13.to(device), b2.to(device)


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# ---- the fused activation kernel -------------------------------------------------------------------------
@pytest.mark.parametrize("activation, limit, inter, k_order, width", [
    ("swiglu", LIMIT, 160, "real", None),  # a partial last group
    ("silu", 0.5, 96, "real", 128),  # the padded columns (width) stay zero with a bias
    ("gelu_tanh", None, 128, "wgmma", 256),
])
def test_quantizer_adds_the_rows_expert_bias_before_the_clamp(activation, limit, inter, k_order, width,
                                                                device):
    g = torch.Generator().manual_seed(inter)
    gu = (torch.randn(7, 2 * inter, generator=g) * 3).to(device)
    w = (torch.rand(7, generator=g) + 0.1).to(device)
    ids = torch.tensor([0, 3, -1, 1, 0, -1, 2], dtype=torch.int32, device=device)
    bias = (torch.randn(5, 2 * inter, generator=g) * 4).to(device)  # up to ~12: both sides of the clamp
    gu[ids < 0] = float("nan")  # inactive rows, their weights and the expert only they would use: unread
    w[ids < 0] = float("nan")
    bias[4] = float("nan")
    q, s = swiglu_quant(gu, w, ids, limit, k_order=k_order, width=width, activation=activation, bias=bias)
    act = ids >= 0
    b = bias[ids[act].long()]
    biased = gu[act] + b
    h = gated_activation(biased[:, :inter], biased[:, inter:], activation, limit) * w[act, None]
    wide = torch.zeros(h.shape[0], width or inter, device=device)
    wide[:, :inter] = h
    q_ref, s_ref = quantize_fp8_act(wide)
    assert torch.equal(s[act], s_ref)
    if k_order == "wgmma":  # the Gluon GEMM's K order
        from moetune.quant.fp8_act import to_wgmma_k_order

        q_ref = to_wgmma_k_order(q_ref)
    same = q[act].view(torch.uint8) == q_ref.view(torch.uint8)
    assert same.float().mean() > 0.999  # exp may differ from torch by an ulp at an e4m3 rounding edge
    assert not torch.equal(s, swiglu_quant(gu, w, ids, limit, k_order=k_order, width=width,
                                           activation=activation)[1])  # the bias changed the function


def test_quantizer_refuses_a_bias_of_another_width():
    gu, w, ids = torch.zeros(2, 64), torch.ones(2), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"bias must be a float tensor \[E, 64\]"):
        swiglu_quant(gu, w, ids, None, bias=torch.zeros(2, 32))


# ---- moe_sum ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("h, dtype", [(96, torch.bfloat16), (1064, torch.float32)])
def test_moe_sum_adds_weighted_down_bias_of_active_routes(h, dtype, device):
    g = torch.Generator().manual_seed(h)
    m, top_k, e = 5, 3, 6
    ids = torch.randint(0, e - 1, (m, top_k), generator=g, dtype=torch.int32)
    ids[torch.rand(m, top_k, generator=g) < 0.3] = -1
    ids[0] = -1
    ids[1, 0] = e - 1  # expert e - 1: one active route; inactive routes' bias rows are poisoned below
    rows = torch.randn(m * top_k, h, generator=g)
    wts = torch.rand(m, top_k, generator=g)
    bias = torch.randn(e, h, generator=g).to(dtype)
    flat = ids.reshape(-1)
    rows[flat < 0] = float("nan")
    wts[ids < 0] = float("nan")
    rows, ids, wts, bias = rows.to(device), ids.to(device), wts.to(device), bias.to(device)
    out = moe_sum(rows, ids, dtype, bias=bias, topk_weights=wts)
    ref = moe_sum_reference(rows, ids, dtype, bias=bias, topk_weights=wts)
    assert torch.isfinite(out).all() and (out[0] == 0).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=torch.finfo(dtype).eps, atol=1e-5)
    assert not torch.allclose(out.float(), moe_sum(rows, ids, dtype).float())
    with pytest.raises(ValueError, match="topk_weights must be a float tensor"):
        moe_sum(rows, ids, dtype, bias=bias)
    with pytest.raises(ValueError, match="bias must be a 2-D float tensor"):
        moe_sum(rows, ids, dtype, bias=bias[:, :-1], topk_weights=wts)


def test_moe_sum_compiles_for_sm90_with_and_without_bias():
    """What the GPU runs (compiled for sm_90 without a GPU): without a bias the launcher passes the weight
    and bias pointers as None (constexprs) and nothing of the bias is in the kernel."""
    from sm90_compile import compile_sm90

    jobs = [{"kernel": "moetune.kernels.fp4_prefill.moe_sum._moe_sum_kernel",
             "const": {"TOP_K": 4, "BLOCK": 1024, "HAS_BIAS": bias, **({} if bias else {"w_ptr": None,
                                                                                      "b_ptr": None})},
             "types": {"rows_ptr": "*fp32", "ids_ptr": "*i32", "w_ptr": "*fp32", "b_ptr": "*bf16",
                       "out_ptr": "*bf16"},
             "options": {"num_warps": 4}} for bias in (False, True)]
    got = compile_sm90(jobs)
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    plain, biased = (g["ptx"].split(".section")[0] for g in got)
    assert plain.count("ld.global") < biased.count("ld.global")


# ---- the layer -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which, bias_dtype", [("both", torch.bfloat16), ("w13_bias", torch.float32),
                                               ("w2_bias", torch.bfloat16)])
def test_layer_with_biases_matches_reference(which, bias_dtype, device):
    args, b13, b2 = _problem(device=device, bias_dtype=bias_dtype)
    kw = {"w13_bias": b13, "w2_bias": b2} if which == "both" else {which: {"w13_bias": b13,
                                                                           "w2_bias": b2}[which]}
    act = {"activation": "swiglu", "swiglu_limit": LIMIT}
    ref = fp4_prefill_moe_reference(*args, **act, **kw)
    out = fp4_prefill_moe(*args, config=CFG, **act, **kw)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert _rel(out, ref) < 1e-2
    assert _rel(fp4_prefill_moe_reference(*args, **act), ref) > 0.1  # the biases matter


def test_zero_biases_give_the_bias_free_output(device):
    """Adding +0 changes no fp32 value: the bias kernels compute the bias-free function exactly."""
    args, b13, b2 = _problem(m=12, device=device)
    plain = fp4_prefill_moe(*args, config=CFG)
    zeros = fp4_prefill_moe(*args, config=CFG, w13_bias=torch.zeros_like(b13), w2_bias=torch.zeros_like(b2))
    assert torch.equal(plain, zeros)


def test_inactive_routes_read_no_bias(device):
    """Experts only inactive routes would use have NaN biases and NaN-decoding scales; inactive routes'
    weights are NaN; a token with every route inactive gets exactly zero."""
    (x, w13p, w13s, w2p, w2s, wts, ids), b13, b2 = _problem(m=16, e=6, top_k=3, active=2 / 3, device=device)
    ids = ids.clone()
    ids[ids >= 4] = -1
    ids[0] = -1
    wts = torch.where(ids >= 0, wts, torch.full_like(wts, float("nan")))
    clean = fp4_prefill_moe_reference(x, w13p, w13s, w2p, w2s, wts, ids, w13_bias=b13, w2_bias=b2)
    for t in (w13s, w2s):
        t[4:] = 255
    for t in (b13, b2):
        t[4:] = float("nan")
    out = fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, config=CFG, w13_bias=b13, w2_bias=b2)
    assert _rel(out, clean) < 1e-2 and (out[0] == 0).all()


def test_biases_with_weights_zero_padded_along_k(device):
    """The biases are per output column: padding H 160 -> 256 (w13's K) and I 96 -> 128 (w2's K) leaves
    w13_bias [E, 2I] and w2_bias [E, H] as they are, and the output the unpadded one."""
    (x, w13p, w13s, w2p, w2s, wts, ids), b13, b2 = _problem(m=12, device=device)
    padded = (x, *pad_mxfp4_k(w13p, w13s, 256), *pad_mxfp4_k(w2p, w2s, 128), wts, ids)
    kw = {"w13_bias": b13, "w2_bias": b2, "activation": "swiglu", "swiglu_limit": LIMIT}
    out = fp4_prefill_moe(*padded, config=CFG, **kw)
    assert torch.equal(out, fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, config=CFG, **kw))
    assert _rel(out, fp4_prefill_moe_reference(*padded, **kw)) < 1e-2


def test_bad_biases_name_the_argument():
    args, b13, b2 = _problem(m=4, e=4)
    cases = [
        ({"w13_bias": b13[:, :-32]}, r"w13_bias must be \[E, 2I\] = \[4, 192\]"),
        ({"w13_bias": b13[:3]}, "w13_bias must be"),
        ({"w2_bias": b2[:, :128]}, r"w2_bias must be \[E, H\] = \[4, 160\]"),
        ({"w2_bias": b2.to(torch.int32)}, "w2_bias must have dtype"),
        ({"w13_bias": b13[None]}, "w13_bias must be 2-D"),
        ({"w2_bias": b2.to("meta")}, "w2_bias is on meta"),
        ({"w13_bias": b13.tolist()}, "w13_bias must be a torch.Tensor"),
    ]
    for kw, what in cases:
        with pytest.raises(ValueError, match=what):
            fp4_prefill_moe(*args, config=CFG, **kw)
        with pytest.raises(ValueError, match=what):
            fp4_prefill_moe_reference(*args, **kw)


@pytest.mark.gpu
def test_gpt_oss_shaped_layer_with_biases_on_the_gpu(device):
    """gpt-oss's H = I = 2880 (padded to 3072 for the Gluon GEMMs), fewer experts; the picker's configs."""
    (x, w13p, w13s, w2p, w2s, wts, ids), b13, b2 = _problem(m=192, h=2880, i=2880, e=8, top_k=4, active=0.9,
                                                            device=device)
    padded = (x, *pad_mxfp4_k(w13p, w13s, 3072), *pad_mxfp4_k(w2p, w2s, 3072), wts, ids)
    kw = {"w13_bias": b13, "w2_bias": b2, "activation": "swiglu", "swiglu_limit": LIMIT}
    ref = fp4_prefill_moe_reference(*padded, **kw)
    assert _rel(fp4_prefill_moe(*padded, **kw), ref) < 1e-2
    assert _rel(fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, **kw), ref) < 1e-2
