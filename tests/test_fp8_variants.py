"""The FP8 decode path's variants against the fp32 reference (Triton interpreter): A_FP8 (two-term fp8
activations on fp8 tensor-core dots) and FUSE (activation fused into gate/up, top_k sum into down)."""

import pytest
import torch
from test_fp8_decode import TOL, make_layer, poison_unused, rel_err

from moetune.kernels import fp8_decode as F
from moetune.routing import make_routes

A8_ROUTE = {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "A_FP8": 1}
A8_GROUPED = {"ALGO": "grouped", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "A_FP8": 1}
FUSED = {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "FUSE": 1}

VARIANTS = {
    "a8-route-split": {"gate_up": {**A8_ROUTE, "SPLIT_K": 2}, "down": {**A8_ROUTE, "BLOCK_SIZE_N": 64}},
    "a8-grouped": {"gate_up": {**A8_GROUPED, "SWAP_AB": 1, "SPLIT_K": 2}, "down": A8_GROUPED},
    "fused": {"gate_up": FUSED, "down": {**FUSED, "BLOCK_SIZE_N": 128}},
    "fused-a8": {"gate_up": {**FUSED, "BLOCK_SIZE_N": 128}, "down": A8_ROUTE},
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_matches_reference_partial_tiles_and_inactive_routes(name):
    """H 300, I 200: partial N and K tiles; I % 64 != 0: fused up tiles straddle scale blocks. Unused
    experts, their scales and inactive routing weights hold NaN and must not be read."""
    args = make_layer(M=3, H=300, I=200, E=6, top_k=3, seed=11)
    ids = args[6]
    ids[0, 1:] = -1
    ids[1, :] = -1  # a token with no active route
    args[5][ids < 0] = 0.0
    ref = F.fp8_decode_moe_reference(*args)
    out = F.fp8_decode_moe(*poison_unused(args), config=VARIANTS[name])
    assert out.dtype == torch.bfloat16 and torch.equal(out[1], torch.zeros_like(out[1]))
    assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("activation,limit", [("swiglu", 0.5), ("gelu_tanh", None)])
def test_fused_activations_and_fp16(activation, limit):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, dtype=torch.float16, seed=12)
    kw = dict(activation=activation, swiglu_limit=limit)
    out = F.fp8_decode_moe(*args, config=VARIANTS["fused"], **kw)
    assert out.dtype == torch.float16
    assert rel_err(out, F.fp8_decode_moe_reference(*args, **kw)) < TOL


def test_a8_single_gemm_is_close_to_w8a16():
    """The two-term activation split keeps the GEMM within ~1e-3 of the exact product (one term: ~3e-2)."""
    x, w13, s13, *_, ids = make_layer(M=2, H=512, I=128, E=4, top_k=2, dtype=torch.float32, seed=13)
    exact = torch.empty(4, 256)
    F.fp8_block_gemm(x, w13, s13, ids, exact, {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 512},
                     a_row_div=2)
    for cfg in (A8_ROUTE, {**A8_GROUPED, "SWAP_AB": 1}):
        got = torch.full((4, 256), float("nan"))
        F.fp8_block_gemm(x, w13, s13, ids, got, cfg, a_row_div=2)
        assert rel_err(got, exact) < 3e-3


@pytest.mark.parametrize("name", ["fused", "a8-route-split"])
def test_all_inactive_zero_and_poisoned_buffers_overwritten(name):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, seed=14)
    conf = {g: F.check_gemm_config(c) for g, c in VARIANTS[name].items()}
    bufs = F.layer_buffers(2, 2, 256, 128, torch.bfloat16, conf, "cpu")
    if name == "fused":  # the fused path needs no fp32 per-route buffers
        assert bufs["gate_up"].numel() == 0 and bufs["down"].numel() == 0
    for t in bufs.values():
        t.fill_(float("nan"))
    out = F.decode_moe_into(*args, conf, bufs)
    assert torch.isfinite(bufs["act"]).all()
    assert rel_err(out, F.fp8_decode_moe_reference(*args)) < TOL
    args[6].fill_(-1)
    for t in bufs.values():
        t.fill_(float("nan"))
    out = F.decode_moe_into(*poison_unused(args), conf, bufs)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(bufs["act"], torch.zeros_like(bufs["act"]))


@pytest.mark.parametrize("cfg,msg", [
    ({"FUSE": 1, "SPLIT_K": 2}, "FUSE"),
    ({"FUSE": 1, "ALGO": "grouped"}, "FUSE"),
    ({"FUSE": 1, "A_FP8": 1}, "FUSE"),
    ({"A_FP8": 2}, "A_FP8"),
    ({"A_FP8": True}, "A_FP8"),
])
def test_bad_variant_options(cfg, msg):
    args = make_layer(M=1, H=256, I=128, E=2, top_k=1, seed=15)
    with pytest.raises(ValueError, match=msg):
        F.fp8_decode_moe(*args, config={"gate_up": cfg})


@pytest.mark.parametrize("tokens,E,block_m,active", [(3, 6, 16, 0.5), (20, 2, 16, 1.0), (16, 256, 16, 0.75),
                                                     (7, 9, 32, 0.0)])
def test_sort_routing_step_equals_onehot(tokens, E, block_m, active):
    gen = torch.Generator().manual_seed(E)
    ids, _ = make_routes(tokens, min(8, E), E, active_fraction=active, generator=gen)
    onehot = F.align_routes(ids, E, block_m, "onehot")
    by_sort = F.align_routes(ids, E, block_m, "sort")
    assert torch.equal(onehot[0], by_sort[0]) and torch.equal(onehot[1], by_sort[1])
    with pytest.raises(ValueError, match="method"):
        F.align_routes(ids, E, block_m, "radix")


class _Spy:
    """Records launches of a Triton kernel and forwards them."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __getitem__(self, grid):
        self.calls += 1
        return self.kernel[grid]


def test_routing_step_default_is_sort_with_onehot_above_its_route_limit(monkeypatch):
    """The default (measured faster on the H200) is "sort"; past the routes one program can sort,
    "onehot" runs instead; every choice buckets the routes the same way."""
    assert F.ALIGN_METHOD == "sort"
    sort_spy, onehot_spy = _Spy(F._align_sort_kernel), _Spy(F._align_kernel)
    monkeypatch.setattr(F, "_align_sort_kernel", sort_spy)
    monkeypatch.setattr(F, "_align_kernel", onehot_spy)
    ids, _ = make_routes(5, 4, 7, active_fraction=0.75, generator=torch.Generator().manual_seed(3))
    default = F.align_routes(ids, 7, 16)
    assert (sort_spy.calls, onehot_spy.calls) == (1, 0)
    onehot = F.align_routes(ids, 7, 16, "onehot")
    assert all(torch.equal(a, b) for a, b in zip(default, onehot, strict=True))
    monkeypatch.setattr(F, "_SORT_MAX_ROUTES", ids.numel() - 1)
    fallback = F.align_routes(ids, 7, 16)
    assert (sort_spy.calls, onehot_spy.calls) == (1, 2)
    assert all(torch.equal(a, b) for a, b in zip(fallback, onehot, strict=True))


def test_public_fused_option():
    """fused=True: FUSED_CONFIG for GEMMs the caller leaves out, no fp32 per-route buffers, the
    reference's result; a given non-FUSE config or a non-bool flag is a ValueError."""
    args = make_layer(M=1, H=128, I=64, E=3, top_k=2, active=0.5, seed=16)
    args[5][args[6] < 0] = 0.0
    ref = F.fp8_decode_moe_reference(*args, fused=True)
    assert rel_err(F.fp8_decode_moe(*poison_unused(args), fused=True), ref) < TOL
    resolved = F.resolve_config(None, {}, 2, fused=True)
    assert resolved == {g: F.check_gemm_config(c) for g, c in F.FUSED_CONFIG.items()}
    given = F.resolve_config({"down": FUSED}, {}, 2, fused=True)
    assert given["down"]["BLOCK_SIZE_N"] == FUSED["BLOCK_SIZE_N"] and given["gate_up"]["FUSE"] == 1
    with pytest.raises(ValueError, match="FUSE"):
        F.fp8_decode_moe(*args, fused=True, config={"gate_up": A8_ROUTE})
    with pytest.raises(ValueError, match="fused"):
        F.fp8_decode_moe(*args, fused="yes")
