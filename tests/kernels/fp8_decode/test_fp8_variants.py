"""The FP8 decode path's variants against the fp32 reference (Triton interpreter): A_FP8 (two-term fp8
activations on fp8 tensor-core dots, split in-kernel (1) or once before the GEMM (2)), FUSE
(activation fused into gate/up, top_k sum into down) and PREFETCH (the GEMV loads its next K chunk
before it multiplies this one)."""

import pytest
import torch
from conftest import DEVICE
from test_fp8_decode import TOL, make_layer, poison_unused, rel_err

from moetune.kernels.fp8_decode.align import ALIGN_METHOD, align_routes
from moetune.kernels.fp8_decode.config import GEMM_DEFAULT, check_gemm_config
from moetune.kernels.fp8_decode.epilogue import gated_activation_rows
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.layer import (
    FUSED_CONFIG,
    decode_moe_into,
    fp8_decode_moe,
    layer_buffers,
    resolve_config,
)
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
from moetune.kernels.fp8_decode.split import split_fp8_rows
from moetune.quant.fp8_block import FP8_DTYPE, dequantize_fp8_block
from moetune.routing import make_routes

A8_ROUTE = {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "A_FP8": 1}
A8_GROUPED = {"ALGO": "grouped", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "A_FP8": 1}
A82_ROUTE = {**A8_ROUTE, "A_FP8": 2}
A82_GROUPED = {**A8_GROUPED, "A_FP8": 2}
FUSED = {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "FUSE": 1}

VARIANTS = {
    "a8-route-split": {"gate_up": {**A8_ROUTE, "SPLIT_K": 2}, "down": {**A8_ROUTE, "BLOCK_SIZE_N": 64}},
    "a8-grouped": {"gate_up": {**A8_GROUPED, "SWAP_AB": 1, "SPLIT_K": 2}, "down": A8_GROUPED},
    "fused": {"gate_up": FUSED, "down": {**FUSED, "BLOCK_SIZE_N": 128}},
    "fused-a8": {"gate_up": {**FUSED, "BLOCK_SIZE_N": 128}, "down": A8_ROUTE},
    "a82-route-split": {"gate_up": {**A82_ROUTE, "SPLIT_K": 2}, "down": {**A82_ROUTE, "BLOCK_SIZE_N": 64}},
    "a82-grouped": {"gate_up": {**A82_GROUPED, "SWAP_AB": 1, "SPLIT_K": 2}, "down": A82_GROUPED},
    "prefetch": {"gate_up": {"ALGO": "route", "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "SPLIT_K": 2,
                             "PREFETCH": 1},
                 "down": {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "PREFETCH": 1}},
}


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # A_FP8 2 splits NaN rows no route reads
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_matches_reference_partial_tiles_and_inactive_routes(name):
    """H 300, I 200: partial N and K tiles; I % 64 != 0: fused up tiles straddle scale blocks. Unused
    experts, their scales and inactive routing weights hold NaN and must not be read."""
    args = make_layer(M=3, H=300, I=200, E=6, top_k=3, seed=11)
    ids = args[6]
    ids[0, 1:] = -1
    ids[1, :] = -1  # a token with no active route
    args[5][ids < 0] = 0.0
    ref = fp8_decode_moe_reference(*args)
    out = fp8_decode_moe(*poison_unused(args), config=VARIANTS[name])
    assert out.dtype == torch.bfloat16 and torch.equal(out[1], torch.zeros_like(out[1]))
    assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("activation,limit", [("swiglu", 0.5), ("gelu_tanh", None)])
def test_fused_activations_and_fp16(activation, limit):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, dtype=torch.float16, seed=12)
    kw = dict(activation=activation, swiglu_limit=limit)
    out = fp8_decode_moe(*args, config=VARIANTS["fused"], **kw)
    assert out.dtype == torch.float16
    assert rel_err(out, fp8_decode_moe_reference(*args, **kw)) < TOL


def test_a8_single_gemm_is_close_to_w8a16():
    """The two-term activation split keeps the GEMM within ~1e-3 of the exact product (one term: ~3e-2)."""
    x, w13, s13, *_, ids = make_layer(M=2, H=512, I=128, E=4, top_k=2, dtype=torch.float32, seed=13)
    exact = torch.empty(4, 256, device=DEVICE)
    fp8_block_gemm(x, w13, s13, ids, exact, {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 512},
                     a_row_div=2)
    for cfg in (A8_ROUTE, {**A8_GROUPED, "SWAP_AB": 1}, A82_ROUTE, {**A82_GROUPED, "SWAP_AB": 1}):
        got = torch.full((4, 256), float("nan"), device=DEVICE)
        fp8_block_gemm(x, w13, s13, ids, got, cfg, a_row_div=2)
        assert rel_err(got, exact) < 3e-3


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("name", ["fused", "a8-route-split", "a82-grouped"])
def test_all_inactive_zero_and_poisoned_buffers_overwritten(name):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, seed=14)
    conf = {g: check_gemm_config(c) for g, c in VARIANTS[name].items()}
    bufs = layer_buffers(2, 2, 256, 128, torch.bfloat16, conf, DEVICE)
    if name == "fused":  # the fused path needs no fp32 per-route buffers
        assert bufs["gate_up"].numel() == 0 and bufs["down"].numel() == 0
    for t in bufs.values():
        t.fill_(float("nan"))
    out = decode_moe_into(*args, conf, bufs)
    assert torch.isfinite(bufs["act"]).all()
    assert rel_err(out, fp8_decode_moe_reference(*args)) < TOL
    args[6].fill_(-1)
    for t in bufs.values():
        t.fill_(float("nan"))
    out = decode_moe_into(*poison_unused(args), conf, bufs)
    assert torch.equal(out, torch.zeros_like(out))
    if name == "fused":  # the fused gate/up GEMV writes its zero rows
        assert torch.equal(bufs["act"], torch.zeros_like(bufs["act"]))
    else:  # no kernel writes (or reads) an inactive route's rows
        assert torch.isnan(bufs["act"]).all() and torch.isnan(bufs["down"]).all()


@pytest.mark.parametrize("cfg,msg", [
    ({"FUSE": 1, "SPLIT_K": 2}, "FUSE"),
    ({"FUSE": 1, "ALGO": "grouped"}, "FUSE"),
    ({"FUSE": 1, "A_FP8": 1}, "FUSE"),
    ({"FUSE": 1, "A_FP8": 2}, "FUSE"),
    ({"A_FP8": 3}, "A_FP8"),
    ({"A_FP8": True}, "A_FP8"),
])
def test_bad_variant_options(cfg, msg):
    args = make_layer(M=1, H=256, I=128, E=2, top_k=1, seed=15)
    with pytest.raises(ValueError, match=msg):
        fp8_decode_moe(*args, config={"gate_up": cfg})


# ---- A_FP8 2: activations split once, before the GEMM -------------------------------------------
def _round_e4m3(v):
    """The kernels' rounding to 3 mantissa bits (half away from zero), by integer ops on the fp32 bits."""
    return ((v.contiguous().view(torch.int32) + 0x80000) & -0x100000).view(torch.float32)


def split_reference(a):
    """torch A_FP8 split of a [rows, K]: per row and 128-K chunk (zero-padded past K), sa = max(amax,
    1e-30) / 448, q = a / sa, hi = e4m3(q), lo = e4m3(8 (q - hi)); (hi, lo [rows, K], sa [rows, chunks])."""
    rows, k = a.shape
    chunks = -(-k // 128)
    padded = torch.zeros(rows, chunks * 128, device=a.device)
    padded[:, :k] = a.float()
    padded = padded.view(rows, chunks, 128)
    sa = padded.abs().amax(-1).clamp_min(1e-30) * (1.0 / 448.0)
    q = padded / sa[..., None]
    hi = _round_e4m3(q)
    lo = _round_e4m3((q - hi) * 8.0)
    terms = [t.to(FP8_DTYPE).view(rows, -1)[:, :k] for t in (hi, lo)]
    return terms[0], terms[1], sa


def assert_terms_equal(got, ref):
    """Bit-equal e4m3 terms, except in e4m3's subnormal range (up to 2^-6), where they may be one subnormal
    step (2^-9) off: the interpreter's fp32 -> e4m3 cast truncates there where torch rounds (0.0017 -> 0,
    not 2^-9); A_FP8 1 shares that cast, and the kernels round to e4m3's mantissa before it, which makes
    the cast exact for normal values."""
    got, ref = got.float(), ref.float()
    off = got != ref
    assert ((got - ref).abs()[off] <= 2.0 ** -9).all() and (ref.abs()[off] <= 2.0 ** -6).all()
    assert off.float().mean() < 0.01


def gemm_reference(a, w, w_scale, ids, a_row_div=1, rw=None):
    """fp32 ``out[r] = (rw[r] *) a[r // a_row_div] @ dequant(w[ids[r]]).T``, zero for inactive routes."""
    flat = ids.reshape(-1)
    out = torch.zeros(flat.numel(), w.shape[1], device=a.device)
    for r, e in enumerate(flat.tolist()):
        if e >= 0:
            out[r] = a[r // a_row_div].float() @ dequantize_fp8_block(w[e], w_scale[e]).T
            if rw is not None:
                out[r] *= rw.reshape(-1)[r]
    return out


@pytest.mark.parametrize("dtype,K", [(torch.bfloat16, 200), (torch.float32, 1100)])
def test_split_rows_matches_reference(dtype, K):
    """K not a multiple of 128 (a partial last chunk), a strided view, a row of zeros, rows of very
    different magnitudes (one scale per row per chunk); into given buffers too."""
    g = torch.Generator(DEVICE).manual_seed(K)
    base = torch.randn(5, 2 * K, generator=g, device=DEVICE)
    base *= torch.tensor([1.0, 1e3, 1.0, 1e-4, 3.0], device=DEVICE)[:, None]
    a = base.to(dtype)[:, ::2]
    a[2] = 0
    assert not a.is_contiguous()
    hi, lo, sa = split_fp8_rows(a)
    ref_hi, ref_lo, ref_sa = split_reference(a)
    assert hi.dtype == lo.dtype == FP8_DTYPE and hi.shape == lo.shape == (5, K)
    assert sa.dtype == torch.float32 and sa.shape == (5, -(-K // 128))
    assert torch.equal(sa, ref_sa)
    assert_terms_equal(hi, ref_hi)
    assert_terms_equal(lo, ref_lo)
    zeros = torch.zeros(K, device=DEVICE)
    assert torch.equal(hi[2].float(), zeros) and torch.equal(lo[2].float(), zeros)
    chunk_sa = sa.repeat_interleave(128, dim=1)[:, :K]
    back = (hi.float() + lo.float() * 0.125) * chunk_sa
    assert ((back - a.float()).abs() <= 2e-3 * chunk_sa * 448).all()  # ~1e-3 of each chunk's amax
    bufs = (torch.full_like(hi, float("nan")), torch.full_like(lo, float("nan")),
            torch.full((5, sa.shape[1] + 2), float("nan"), device=DEVICE)[:, 1:-1])
    got = split_fp8_rows(a, out=bufs)
    assert all(x is y for x, y in zip(got, bufs, strict=True))
    assert torch.equal(bufs[2], sa)
    assert torch.equal(bufs[0].view(torch.uint8), hi.view(torch.uint8))
    assert torch.equal(bufs[1].view(torch.uint8), lo.view(torch.uint8))
    with pytest.raises(ValueError, match="out: sa must be float32"):
        split_fp8_rows(a, out=(hi, lo, sa[:, :1]))


@pytest.mark.parametrize("inter,splits,dtype", [(200, 1, torch.bfloat16), (256, 2, torch.float16),
                                                 (64, 1, torch.float32), (1100, 3, torch.bfloat16)])
def test_the_activation_writes_the_split_split_fp8_rows_would(inter, splits, dtype):
    """The gated activation's split (I under, at and over one 128 chunk, partial last chunks, K-split
    partials, inactive routes) equals split_fp8_rows of its own output, bit for bit; poisoned buffers are
    fully written."""
    g = torch.Generator(DEVICE).manual_seed(inter)
    gu = torch.randn(splits, 6, 2 * inter, generator=g, device=DEVICE)
    ids = torch.tensor([0, -1, 2, 3, -1, 1], device=DEVICE)
    out = torch.full((6, inter), float("nan"), dtype=dtype, device=DEVICE)
    hi = torch.full((6, inter), float("nan"), dtype=FP8_DTYPE, device=DEVICE)
    lo, sa = hi.clone(), torch.full((6, -(-inter // 128)), float("nan"), device=DEVICE)
    gated_activation_rows(gu, ids, out, "swiglu", 7.0, split=(hi, lo, sa))
    alone = gated_activation_rows(gu, ids, torch.empty_like(out), "swiglu", 7.0)
    ref_hi, ref_lo, ref_sa = split_fp8_rows(alone)
    assert torch.equal(out, alone) and torch.equal(sa, ref_sa)
    assert torch.equal(hi.view(torch.uint8), ref_hi.view(torch.uint8))
    assert torch.equal(lo.view(torch.uint8), ref_lo.view(torch.uint8))
    with pytest.raises(ValueError, match="split: sa must be float32"):
        gated_activation_rows(gu, ids, out, "silu", split=(hi, lo, sa[:, :0]))


def test_the_layer_splits_down_s_input_in_the_activation(monkeypatch):
    """With down on A_FP8 2 the layer launches no split of its own for down (gate/up's still splits x):
    the same output, bit for bit, as the layer with the separate split launch."""
    args = make_layer(M=3, H=304, I=208, E=5, top_k=3, seed=19)
    conf = {"gate_up": {**GEMM_DEFAULT, **A82_GROUPED, "SWAP_AB": 1},
            "down": {**GEMM_DEFAULT, **A82_GROUPED, "BLOCK_SIZE_N": 64}}
    from moetune.kernels.fp8_decode import gemm, layer

    calls = []
    real = gemm.split_fp8_rows  # the split fp8_block_gemm launches

    def spy(a, *k, **kw):
        calls.append(a.shape)
        return real(a, *k, **kw)

    monkeypatch.setattr(gemm, "split_fp8_rows", spy)
    bufs = layer_buffers(3, 3, 304, 208, torch.bfloat16, conf, DEVICE)
    fused = decode_moe_into(*args, conf, bufs).clone()
    assert calls == [(3, 304)]  # x for gate/up only
    monkeypatch.setattr(layer, "_act_split", lambda config: False)
    calls.clear()
    apart = decode_moe_into(*args, conf, layer_buffers(3, 3, 304, 208, torch.bfloat16, conf, DEVICE))
    assert calls == [(3, 304), (9, 208)] and torch.equal(fused, apart)
    assert rel_err(fused, fp8_decode_moe_reference(*args)) < TOL


A82_CONFIGS = [
    {**A82_ROUTE, "BLOCK_SIZE_N": 64},
    {**A82_ROUTE, "SPLIT_K": 2, "BLOCK_SIZE_K": 128},
    {**A82_GROUPED, "SWAP_AB": 0, "BLOCK_SIZE_K": 256},
    {**A82_GROUPED, "SWAP_AB": 1, "SPLIT_K": 2},
]


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the interpreter's amax of a NaN row, never used
@pytest.mark.parametrize("cfg", A82_CONFIGS, ids=["route", "route-split", "grouped", "grouped-swap-split"])
def test_a82_down_gemm_k200_strided_padded_and_poisoned(cfg):
    """The down GEMM (A row = route, routing weight applied) at K 200 (last chunk partial) from a strided
    activation, with NaN scale padding, NaN in unused experts, inactive routes' weights and rows, and a
    NaN output buffer: matches the fp32 reference and equals A_FP8 1 up to rounding."""
    _, _, _, w2, s2, rw, ids = make_layer(M=3, H=256, I=200, E=6, top_k=3, seed=21)
    ids[0, 1:] = -1
    ids[1, :] = -1
    routes = ids.numel()
    g = torch.Generator(DEVICE).manual_seed(22)
    act = torch.zeros(routes, 400, dtype=torch.bfloat16, device=DEVICE)[:, ::2]
    act.copy_(torch.randn(routes, 200, generator=g, device=DEVICE))
    s2_pad = torch.full((6, s2.shape[1], s2.shape[2] + 2), float("nan"), device=DEVICE)
    s2_pad[:, :, : s2.shape[2]] = s2
    rw[ids < 0] = 0.0
    ref = gemm_reference(act, w2, s2, ids, rw=rw)
    inactive = ids.reshape(-1) < 0
    act[inactive] = float("nan")
    rw[ids < 0] = float("nan")
    used = set(ids[ids >= 0].tolist())
    for e in set(range(6)) - used:
        w2[e].view(torch.uint8).fill_(0x7F)
        s2_pad[e] = float("nan")
    out = torch.full((routes, 256), float("nan"), device=DEVICE)
    fp8_block_gemm(act, w2, s2_pad, ids, out, cfg, topk_weights=rw)
    assert torch.equal(out[inactive], torch.zeros(int(inactive.sum()), 256, device=DEVICE))
    assert rel_err(out, ref) < TOL
    mode1 = torch.full((routes, 256), float("nan"), device=DEVICE)
    fp8_block_gemm(act, w2, s2_pad, ids, mode1, {**cfg, "A_FP8": 1}, topk_weights=rw)
    torch.testing.assert_close(out, mode1, rtol=1e-5, atol=1e-5)


def test_a82_given_split():
    """a_split= (the split of a, e.g. made once for several GEMMs) gives the result of the split made
    inside; it is checked (shapes, dtypes) and only taken with A_FP8 2."""
    x, w13, s13, *_, ids = make_layer(M=2, H=300, I=64, E=4, top_k=2, seed=23)
    cfg = {**A82_GROUPED, "SWAP_AB": 1, "SPLIT_K": 2}
    inside = torch.full((4, 128), float("nan"), device=DEVICE)
    fp8_block_gemm(x, w13, s13, ids, inside, cfg, a_row_div=2)
    hi, lo, sa = split_fp8_rows(x)
    sa_pad = torch.full((2, sa.shape[1] + 1), float("nan"), device=DEVICE)
    sa_pad[:, :-1] = sa  # a padded scale column is never read
    given = torch.full((4, 128), float("nan"), device=DEVICE)
    fp8_block_gemm(x, w13, s13, ids, given, cfg, a_row_div=2, a_split=(hi, lo, sa_pad))
    assert torch.equal(given, inside)
    assert rel_err(given, gemm_reference(x, w13, s13, ids, a_row_div=2)) < TOL
    bad = [((hi[:1], lo, sa), "a_split: hi must be"), ((hi, lo.float(), sa), "a_split: lo must be"),
           ((hi, lo, sa[:, :1]), "a_split: sa must be"), ((hi, lo, sa.double()), "a_split: sa must be"),
           ((hi, lo), "a_split must be a tuple"),
           ((hi, lo.t().contiguous().t(), sa), "a_split: lo must have")]
    for split, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fp8_block_gemm(x, w13, s13, ids, given, cfg, a_row_div=2, a_split=split)
    with pytest.raises(ValueError, match="a_split is only used with A_FP8 2"):
        fp8_block_gemm(x, w13, s13, ids, given, A8_GROUPED, a_row_div=2, a_split=(hi, lo, sa))


@pytest.mark.parametrize("tokens,E,block_m,active", [(3, 6, 16, 0.5), (20, 2, 16, 1.0), (16, 256, 16, 0.75),
                                                     (7, 9, 32, 0.0)])
def test_sort_routing_step_equals_onehot(tokens, E, block_m, active):
    gen = torch.Generator(DEVICE).manual_seed(E)
    ids, _ = make_routes(tokens, min(8, E), E, active_fraction=active, generator=gen, device=DEVICE)
    onehot = align_routes(ids, E, block_m, "onehot")
    by_sort = align_routes(ids, E, block_m, "sort")
    assert all(torch.equal(a, b) for a, b in zip(onehot, by_sort, strict=True))  # ids, experts, used
    with pytest.raises(ValueError, match="method"):
        align_routes(ids, E, block_m, "radix")


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
    from moetune.kernels.fp8_decode import align

    assert ALIGN_METHOD == "sort"
    sort_spy, onehot_spy = _Spy(align._align_sort_kernel), _Spy(align._align_kernel)
    monkeypatch.setattr(align, "_align_sort_kernel", sort_spy)
    monkeypatch.setattr(align, "_align_kernel", onehot_spy)
    ids, _ = make_routes(5, 4, 7, active_fraction=0.75, generator=torch.Generator(DEVICE).manual_seed(3),
                         device=DEVICE)
    default = align_routes(ids, 7, 16)
    assert (sort_spy.calls, onehot_spy.calls) == (1, 0)
    onehot = align_routes(ids, 7, 16, "onehot")
    assert all(torch.equal(a, b) for a, b in zip(default, onehot, strict=True))
    monkeypatch.setattr(align, "_SORT_MAX_ROUTES", ids.numel() - 1)
    fallback = align_routes(ids, 7, 16)
    assert (sort_spy.calls, onehot_spy.calls) == (1, 2)
    assert all(torch.equal(a, b) for a, b in zip(fallback, onehot, strict=True))


def test_public_fused_option():
    """fused=True: FUSED_CONFIG for GEMMs the caller leaves out, no fp32 per-route buffers, the
    reference's result; a given non-FUSE config or a non-bool flag is a ValueError."""
    args = make_layer(M=1, H=128, I=64, E=3, top_k=2, active=0.5, seed=16)
    args[5][args[6] < 0] = 0.0
    ref = fp8_decode_moe_reference(*args, fused=True)
    assert rel_err(fp8_decode_moe(*poison_unused(args), fused=True), ref) < TOL
    resolved = resolve_config(None, {}, 2, fused=True)
    assert resolved == {g: check_gemm_config(c) for g, c in FUSED_CONFIG.items()}
    given = resolve_config({"down": FUSED}, {}, 2, fused=True)
    assert given["down"]["BLOCK_SIZE_N"] == FUSED["BLOCK_SIZE_N"] and given["gate_up"]["FUSE"] == 1
    with pytest.raises(ValueError, match="FUSE"):
        fp8_decode_moe(*args, fused=True, config={"gate_up": A8_ROUTE})
    with pytest.raises(ValueError, match="fused"):
        fp8_decode_moe(*args, fused="yes")


@pytest.mark.parametrize("split", [1, 2, 3])
def test_prefetch_changes_the_schedule_not_the_sums(split):
    """The same chunks in the same order: PREFETCH 1 gives the GEMV's result bit for bit, whether a split
    holds several chunks, one, or a partial one (K 300: chunks of 128, 128, 44)."""
    x, w13, s13, *_, ids = make_layer(M=3, H=300, I=100, E=5, top_k=2, active=0.75, seed=14)
    base = {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "SPLIT_K": split}
    outs = []
    for prefetch in (0, 1):
        out = torch.full((split, 6, 200), float("nan"), device=DEVICE)
        fp8_block_gemm(x, w13, s13, ids, out, {**base, "PREFETCH": prefetch}, a_row_div=2)
        outs.append(out)
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("stages,split", [(2, 1), (3, 2), (4, 3)])
def test_gemv_stages_change_the_schedule_not_the_sums(stages, split):
    """GEMV_STAGES pipelines the plain GEMV's loads: the same chunks, the same sums, bit for bit (K 300:
    a partial last chunk; splits of several, one and a partial chunk)."""
    x, w13, s13, *_, ids = make_layer(M=3, H=300, I=100, E=5, top_k=2, active=0.75, seed=21)
    base = {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "SPLIT_K": split}
    outs = []
    for st in (1, stages):
        out = torch.full((split, 6, 200), float("nan"), device=DEVICE)
        fp8_block_gemm(x, w13, s13, ids, out, {**base, "GEMV_STAGES": st}, a_row_div=2)
        outs.append(out)
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("bad", [{"BLOCK_SIZE_K": 256}, {"A_FP8": 2}, {"ALGO": "grouped"}, {"PREFETCH": 2}])
def test_prefetch_only_for_the_w8a16_gemv_at_128_k(bad):
    with pytest.raises(ValueError, match="PREFETCH"):
        check_gemm_config({"ALGO": "route", "BLOCK_SIZE_K": 128, "PREFETCH": 1, **bad})


# ---- W_TMA: weight tiles by TMA copies (the interpreter emulates the descriptor loads) -----------
TMA_VARIANTS = {
    "route-a82-split": {"gate_up": {**A82_ROUTE, "BLOCK_SIZE_N": 64, "SPLIT_K": 2, "W_TMA": 1},
                        "down": {**A82_ROUTE, "BLOCK_SIZE_N": 64, "W_TMA": 1}},
    "grouped-a82-swap": {"gate_up": {**A82_GROUPED, "SWAP_AB": 1, "W_TMA": 1},
                         "down": {**A82_GROUPED, "BLOCK_SIZE_N": 32, "SWAP_AB": 1, "W_TMA": 1}},
    "grouped-a8": {"gate_up": {**A8_GROUPED, "BLOCK_SIZE_K": 256, "W_TMA": 1},
                   "down": {**A8_GROUPED, "BLOCK_SIZE_N": 64, "W_TMA": 1}},
}


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("name", TMA_VARIANTS)
def test_w_tma_matches_reference_partial_tiles_and_inactive_routes(name):
    """H 304, I 208: TMA-aligned rows (multiples of 16 bytes) but partial N and K tiles, whose copies read
    zeros past the expert's last row and column instead of the next expert's; NaN-poisoned unused experts
    must not be read."""
    args = make_layer(M=3, H=304, I=208, E=5, top_k=3, seed=16)
    ids = args[6]
    ids[0, 1:] = -1
    args[5][ids < 0] = 0.0
    ref = fp8_decode_moe_reference(*args)
    out = fp8_decode_moe(*poison_unused(args), config=TMA_VARIANTS[name])
    assert rel_err(out, ref) < TOL


def test_w_tma_refuses_what_tma_cannot_address():
    args = make_layer(M=1, H=256, I=128, E=2, top_k=1, seed=17)
    with pytest.raises(ValueError, match="W_TMA"):  # the W8A16 GEMV has no tile copies to replace
        fp8_decode_moe(*args, config={"gate_up": {"W_TMA": 1}})
    x, w13, s13, *_, ids = args
    out = torch.empty(1, 256, device=DEVICE)
    wide = torch.empty(2, 256, 512, dtype=w13.dtype, device=DEVICE)
    wide[:, :, ::2] = w13
    with pytest.raises(ValueError, match="W_TMA.*unit stride"):  # K-strided weights
        fp8_block_gemm(x, wide[:, :, ::2], s13, ids, out, A82_ROUTE | {"W_TMA": 1})
    odd = make_layer(M=1, H=296, I=128, E=2, top_k=1, seed=17)  # rows of 296 bytes: not 16-aligned
    with pytest.raises(ValueError, match="W_TMA"):
        fp8_block_gemm(odd[0], odd[1], odd[2], odd[6], torch.empty(1, 256, device=DEVICE),
                       A82_ROUTE | {"W_TMA": 1})
