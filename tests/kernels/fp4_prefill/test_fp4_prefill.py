"""The FP4 grouped prefill path against its fp32 reference (Triton interpreter on the CPU)."""

import pytest
import torch

from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
from moetune.quant import pad_mxfp4_k, quantize_mxfp4
from moetune.routing import make_routes


def _weights(e, h, i, g, device):
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g) * 0.05)
    return [t.to(device) for t in (*w13, *w2)]


def _problem(m=24, h=128, i=64, e=4, top_k=2, routing="uniform", active=1.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16).to(device)
    ids, wts = make_routes(m, top_k, e, routing=routing, active_fraction=active, generator=g, device=device)
    return x, *_weights(e, h, i, g, device), wts, ids


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _cfg(bm, bn, bk, decode="fp8_scaled", unpack="join", **kw):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=4, DECODE=decode, UNPACK=unpack,
                **kw)


# Tiles: every M tile, N tiles with a partial last tile (2I = 192, H = 160), K tiles with a partial
# last chunk, and each decode design.
@pytest.mark.parametrize("gate_up, down", [
    (_cfg(16, 64, 64), _cfg(16, 32, 32, "fp8")),
    (_cfg(32, 128, 128, "fp8"), _cfg(32, 64, 64, "bf16")),
    (_cfg(64, 64, 128, "bf16", "asm"), _cfg(64, 128, 32, "fp8_scaled", "asm")),
    (_cfg(128, 32, 32, "fp8_scaled", GROUP_SIZE_M=1), _cfg(128, 64, 128, "bf16", num_stages=2)),
    (_cfg(16, 64, 128, "f16", "asm"), _cfg(16, 64, 64, "fp8_row")),
    (_cfg(64, 32, 64, "fp8_row", "asm"), _cfg(32, 64, 32, "f16")),
    (_cfg(16, 128, 256, "bf16"), _cfg(32, 64, 64, "fp8", "asm", GROUP_SIZE_M=16)),
    # SWAP_AB (weights on the MMA's left) with every decode, and the f16x2 unpack
    (_cfg(16, 64, 128, "f16", "asm16", SWAP_AB=1), _cfg(32, 64, 64, "fp8", "asm16", SWAP_AB=1)),
    (_cfg(32, 128, 64, "fp8_row", "asm16", SWAP_AB=1), _cfg(16, 32, 32, "bf16", "asm16", SWAP_AB=1)),
    (_cfg(64, 64, 64, "fp8_scaled", SWAP_AB=1), _cfg(16, 64, 128, "f16", "asm", SWAP_AB=1)),
    # halves: even-k and odd-k codes dotted apart (K tail of 32 in both GEMMs: 160 and 96)
    (_cfg(16, 64, 128, "fp8", "halves"), _cfg(32, 64, 64, "f16", "halves", SWAP_AB=1)),
    (_cfg(32, 32, 64, "fp8_row", "halves", SWAP_AB=1), _cfg(16, 128, 256, "bf16", "halves")),
    # lut: re-based e4m3 bytes by table lookup, two dots of K/2 (K tails of 32 again)
    (_cfg(16, 64, 128, "fp8", "lut"), _cfg(32, 64, 64, "fp8_row", "lut", SWAP_AB=1)),
    (_cfg(32, 32, 64, "fp8_row", "lut", SWAP_AB=1, W_TMA=1), _cfg(16, 128, 128, "fp8", "lut", W_TMA=1)),
    # M tiles over N tiles: the weights are put back in k order instead (one dot)
    (_cfg(64, 32, 64, "fp8", "lut"), _cfg(128, 64, 128, "fp8_row", "lut", SWAP_AB=1, W_TMA=1)),
    # W_TMA: packed weight tiles by TMA copies, zeros past N and K (partial tiles in both GEMMs)
    (_cfg(16, 64, 128, "fp8", "halves", SWAP_AB=1, W_TMA=1), _cfg(32, 64, 64, "fp8_row", W_TMA=1)),
    (_cfg(64, 128, 64, "bf16", "asm", W_TMA=1), _cfg(16, 32, 128, "f16", "asm16", SWAP_AB=1, W_TMA=1)),
    # SCALE_AHEAD (each chunk's scales loaded a step early) and A_QUADS (lut's activation halves loaded apart)
    (_cfg(16, 64, 128, "fp8", "lut", SCALE_AHEAD=1, A_QUADS=1),
     _cfg(32, 64, 64, "fp8_row", "lut", SWAP_AB=1, W_TMA=1, SCALE_AHEAD=1, A_QUADS=1)),
    (_cfg(64, 32, 64, "fp8_row", "lut", SCALE_AHEAD=1), _cfg(16, 64, 128, "bf16", "halves", SCALE_AHEAD=1)),
    (_cfg(32, 128, 64, "f16", "asm16", SWAP_AB=1, SCALE_AHEAD=1),
     _cfg(16, 32, 64, "fp8", "lut", SWAP_AB=1, A_QUADS=1)),
])
def test_tiles_and_decodes_match_reference(gate_up, down, device):
    args = _problem(m=20, h=160, i=96, e=4, top_k=2, device=device)
    ref = fp4_prefill_moe_reference(*args)
    out = fp4_prefill_moe(*args, config={"gate_up": gate_up, "down": down})
    assert out.shape == (20, 160) and out.dtype == torch.bfloat16
    assert _rel(out, ref) < 1e-2


def test_bf16_route_rows_are_the_fp32_rows_rounded(device):
    """OUT_DTYPE bf16 (down's): the per-route rows are the fp32 rows cast (the interpreter's cast truncates
    where the GPU rounds: one bf16 ulp), the sum over top_k reads them, and the whole path stays in
    tolerance; gate/up refuses it (its rows feed the fp8 quantizer)."""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.config import normalize_config
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import quantize_fp8_act

    x, w13p, w13s, w2p, w2s, wts, ids = args = _problem(m=20, h=160, i=96, e=4, top_k=2, active=0.8,
                                                        device=device)
    cfg = _cfg(32, 64, 64, "fp8_row", "lut")
    q, s = quantize_fp8_act(torch.randn(40, 96, generator=torch.Generator().manual_seed(1)).to(device))
    align = align_routes(ids, 4, 32)
    active = ids.reshape(-1) >= 0
    rows = {}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        rows[name] = torch.full((40, 160), float("nan"), dtype=dtype, device=device)
        grouped_gemm(q, s, w2p, w2s, rows[name], align, a_div=1,
                     config=normalize_config({**cfg, "OUT_DTYPE": name}, "down"))
    f32, b16 = rows["fp32"][active], rows["bf16"][active].float()
    assert torch.isfinite(b16).all() and f32.abs().sum() > 0
    torch.testing.assert_close(b16, f32, rtol=2 ** -7, atol=0)
    with pytest.raises(ValueError, match="OUT_DTYPE 'bf16' writes torch.bfloat16"):
        grouped_gemm(q, s, w2p, w2s, rows["fp32"], align, a_div=1,
                     config=normalize_config({**cfg, "OUT_DTYPE": "bf16"}, "down"))
    out = fp4_prefill_moe(*args, config={"gate_up": cfg, "down": {**cfg, "OUT_DTYPE": "bf16"}})
    assert _rel(out, fp4_prefill_moe_reference(*args)) < 1e-2
    with pytest.raises(ValueError, match="OUT_DTYPE 'bf16' is down's only"):
        fp4_prefill_moe(*args, config={"gate_up": {**cfg, "OUT_DTYPE": "bf16"}, "down": cfg})


def _spread_weights(e, n, k, max_d, g):
    """MXFP4 weights whose 32-blocks are 2^0 .. 2^-max_d apart inside every chunk and row."""
    shift = torch.randint(0, max_d + 1, (e, n, k // 32, 1), generator=g).float()
    return quantize_mxfp4((torch.randn(e, n, k // 32, 32, generator=g) * torch.exp2(-shift)).reshape(e, n, k))


@pytest.mark.parametrize("decode, swap", [("fp8", 0), ("fp8_row", 1)])
def test_lut_matches_halves_across_scale_spreads(decode, swap, device):
    """One grouped GEMM, fp32 out, weight blocks 2^0 .. 2^-20 apart inside every chunk and row (every
    re-base distance of the pools, the ones that round to e4m3 subnormals and to zero included).
    lut and halves dot the same e4m3 weights in another grouping of K, so they agree to the rounding of
    the sums (fp32 on the CPU; on the GPU, sm_90's fp8 wgmma accumulates with fewer bits: 1.2e-4 was
    seen on the H200, where a wrong pool would be off by far more); both are held to the reference.
    (Distances beyond 9 round to e4m3 subnormals, where the interpreter's fp16 -> e4m3 cast truncates:
    there its halves is off, so on the CPU only blocks at most 2^-7 apart, whose scales stay within 9,
    are compared.)"""
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import grouped_gemm
    from moetune.quant import dequantize_mxfp4, quantize_fp8_act

    g = torch.Generator().manual_seed(3)
    x = torch.randn(20, 256, generator=g).to(device)
    ids, _ = make_routes(20, 2, 4, generator=g, device=device)
    q, qs = quantize_fp8_act(x)
    align = align_routes(ids, 4, 16)
    for max_d in (7, 20):
        w, ws = (t.to(device) for t in _spread_weights(4, 128, 256, max_d, g))
        wd = dequantize_mxfp4(w, ws)
        ref = torch.stack([(q[r // 2].float() * qs[r // 2].repeat_interleave(128)) @ wd[e].T
                           for r, e in enumerate(ids.flatten().tolist())])
        outs = []
        for unpack in ("halves", "lut"):
            out = torch.full((40, 128), float("nan"), device=device)
            grouped_gemm(q, qs, w, ws, out, align, a_div=2,
                         config=_cfg(16, 64, 128, decode, unpack, SWAP_AB=swap, GROUP_SIZE_M=8, num_stages=1,
                                     A_LAYOUT="indexed", W_TMA=0))
            outs.append(out)
            assert _rel(out, ref) < 1e-2
        if max_d == 7 or device == "cuda":
            diff = _rel(outs[1], outs[0])
            assert diff < (1e-3 if device == "cuda" else 1e-5), (max_d, diff)


@pytest.mark.parametrize("kw", [
    dict(e=8, top_k=1, routing="zipf:4"),  # skewed: one expert takes most routes, others empty
    dict(e=6, top_k=6, m=8),  # every expert per token
    dict(e=1, top_k=1, m=9),
])
def test_routing_shapes(kw, device):
    args = _problem(device=device, **kw)
    cfg = _cfg(16, 64, 128)
    out = fp4_prefill_moe(*args, config={"gate_up": cfg, "down": cfg})
    assert _rel(out, fp4_prefill_moe_reference(*args)) < 1e-2


def test_empty_experts_and_swiglu_limit(device):
    x, *w, wts, ids = _problem(e=8, device=device)
    ids = torch.where(ids % 3 == 0, ids, torch.zeros_like(ids))  # experts 1, 2, 4, 5, 7 get nothing
    args = (x, *w, wts, ids)
    cfg = _cfg(32, 64, 64, "fp8")
    out = fp4_prefill_moe(*args, swiglu_limit=0.05, config={"gate_up": cfg, "down": cfg})
    ref = fp4_prefill_moe_reference(*args, swiglu_limit=0.05)
    assert _rel(out, ref) < 1e-2
    assert _rel(ref, fp4_prefill_moe_reference(*args)) > 1e-2  # the limit did clamp something


def test_inactive_routes_read_nothing(device):
    """Experts only inactive routes would use hold NaN-decoding scales (255); weights there are NaN."""
    x, w13p, w13s, w2p, w2s, wts, ids = _problem(m=16, e=6, top_k=3, active=2 / 3, device=device)
    ids = ids.clone()
    ids[ids >= 4] = -1  # experts 4 and 5 are touched only by inactive routes now
    wts = torch.where(ids >= 0, wts, torch.full_like(wts, float("nan")))
    clean = fp4_prefill_moe_reference(x, w13p, w13s, w2p, w2s, wts, ids)
    for s in (w13s, w2s):
        s[4:] = 255
    cfg = _cfg(16, 64, 64)
    out = fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, config={"gate_up": cfg, "down": dict(cfg)})
    assert _rel(out, clean) < 1e-2
    tma = _cfg(16, 64, 64, "fp8", W_TMA=1)
    out = fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, config={"gate_up": tma, "down": tma})
    assert _rel(out, clean) < 1e-2
    # a token whose routes are all inactive gets exactly zero
    ids[0] = -1
    out = fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, config={"gate_up": cfg, "down": cfg})
    assert (out[0] == 0).all() and torch.isfinite(out).all()


def test_gathered_layout_matches_indexed(device):
    pytest.importorskip("moetune.kernels.gather_rows.gather")
    args = _problem(m=12, e=4, top_k=2, device=device)
    down = _cfg(16, 64, 64)
    out = fp4_prefill_moe(*args, config={"gate_up": _cfg(16, 64, 128, A_LAYOUT="gathered"), "down": down})
    ref = fp4_prefill_moe(*args, config={"gate_up": _cfg(16, 64, 128), "down": down})
    assert torch.equal(out, ref)


def test_default_config_from_picker_and_zero_tokens(device):
    args = _problem(m=6, device=device)
    assert _rel(fp4_prefill_moe(*args), fp4_prefill_moe_reference(*args)) < 1e-2
    x, *w, wts, ids = args
    out = fp4_prefill_moe(x[:0], *w, wts[:0], ids[:0])
    assert out.shape == (0, x.shape[1])


def _bad(args, **changes):
    names = ["x", "w13_packed", "w13_scale", "w2_packed", "w2_scale", "topk_weights", "topk_ids"]
    return [changes.get(n, a) for n, a in zip(names, args, strict=True)]


def test_bad_inputs_name_the_argument():
    x, w13p, w13s, w2p, w2s, wts, ids = args = _problem(m=4)
    cases = {
        "x": _bad(args, x=x.to(torch.int32)),
        "hidden size": _bad(args, x=x[:, :100]),
        "w13_packed": _bad(args, w13_packed=w13p.view(torch.int8)),
        "w13_scale": _bad(args, w13_scale=w13s[:, :, :2]),
        "w2_packed": _bad(args, w2_packed=w2p[:, :, :16]),
        "w2_scale": _bad(args, w2_scale=w2s[:1]),
        "topk_ids": _bad(args, topk_ids=ids.float()),
        "topk_weights": _bad(args, topk_weights=wts[:, :1]),
        "device": _bad(args, w2_scale=w2s.to("meta")),
    }
    wide_p, wide_s = pad_mxfp4_k(w13p, w13s, 384)  # H 128 padded by 256: a wrong x, not a padding
    cases["w13_packed must be .* by under 256"] = _bad(args, w13_packed=wide_p, w13_scale=wide_s)
    for what, bad in cases.items():
        with pytest.raises(ValueError, match=what):
            fp4_prefill_moe(*bad, config={"gate_up": {}, "down": {}})
        with pytest.raises(ValueError, match=what):
            fp4_prefill_moe_reference(*bad)


@pytest.mark.parametrize("config, what", [
    ({"gate_up": {"BLOCK_SIZE_Q": 16}}, "BLOCK_SIZE_Q"),
    ({"gate_up": {"BLOCK_SIZE_K": 48}}, "BLOCK_SIZE_K"),
    ({"down": {"BLOCK_SIZE_K": 96}}, "BLOCK_SIZE_K"),
    ({"down": {"BLOCK_SIZE_N": 48}}, "BLOCK_SIZE_N"),
    ({"down": {"BLOCK_SIZE_M": 8}}, "BLOCK_SIZE_M"),
    ({"down": {"A_LAYOUT": "gathered"}}, "A_LAYOUT"),
    ({"down": {"DECODE": "fp8", "BLOCK_SIZE_K": 256}}, "BLOCK_SIZE_K"),
    ({"gate_up": {"DECODE": "int4"}}, "DECODE"),
    ({"gate_up": {"num_stages": 0}}, "num_stages"),
    ({"gate_up": {"W_TMA": 2}}, "W_TMA"),
    ({"down": {"W_TMA": 1, "DECODE": "fp8_scaled"}}, "W_TMA"),
    ({"gate_up": {"SCALE_AHEAD": True}}, "SCALE_AHEAD"),
    ({"down": {"OUT_DTYPE": "fp16"}}, "OUT_DTYPE"),
    ({"down": {"A_RESIDENT": 1}}, "A_RESIDENT"),
    ({"down": {"SCALE_AHEAD": 1, "DECODE": "fp8_scaled"}}, "SCALE_AHEAD"),
    ({"down": {"A_QUADS": 1, "DECODE": "fp8", "UNPACK": "halves", "BLOCK_SIZE_K": 64}}, "A_QUADS"),
    ({"gate_up": {"A_QUADS": 1, "DECODE": "fp8", "UNPACK": "lut", "BLOCK_SIZE_M": 128}}, "A_QUADS"),
    ({"middle": {}}, "middle"),
    ([1, 2], "config"),
])
def test_bad_configs_name_the_key(config, what):
    with pytest.raises(ValueError, match=what):
        fp4_prefill_moe(*_problem(m=4), config=config)


def test_validate_checks_ids_and_scale_codes():
    x, w13p, w13s, w2p, w2s, wts, ids = _problem(m=4)
    bad_ids = ids.clone()
    bad_ids[0, 0] = 99
    with pytest.raises(ValueError, match="topk_ids"):
        fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, bad_ids, validate=True,
                        config={"gate_up": {}, "down": {}})
    w2s = w2s.clone()
    w2s[0, 0, 0] = 250
    with pytest.raises(ValueError, match="w2_scale"):
        fp4_prefill_moe(x, w13p, w13s, w2p, w2s, wts, ids, validate=True,
                        config={"gate_up": {}, "down": {"DECODE": "fp8_scaled"}})


@pytest.mark.parametrize("decode", ["fp8", "fp8_row", "f16"])
def test_rebased_decodes_with_widely_spread_scales(decode, device):
    """Scale blocks 2^12 apart inside a row: re-basing rounds the small blocks, the error stays tiny."""
    x, w13p, w13s, w2p, w2s, wts, ids = _problem(m=12, e=2, top_k=1, device=device)
    w13s = w13s.clone()
    w13s[..., 1::2] -= 12  # every other 32-block of each row is 4096x smaller
    args = (x, w13p, w13s, w2p, w2s, wts, ids)
    cfg = _cfg(16, 64, 128, decode)
    out = fp4_prefill_moe(*args, config={"gate_up": cfg, "down": cfg})
    assert _rel(out, fp4_prefill_moe_reference(*args)) < 1e-2


@pytest.mark.parametrize("gate_up, down", [
    (_cfg(16, 64, 64, "fp8", "lut"), _cfg(32, 64, 64, "fp8_row", "lut", SWAP_AB=1)),
    (_cfg(32, 64, 128, "fp8_row", "halves", SWAP_AB=1), _cfg(16, 32, 32, "bf16")),
])
def test_weights_zero_padded_along_k_give_the_same_output(gate_up, down, device):
    """H 160 and I 96 padded to 256 and 128 (pad_mxfp4_k): the activations are quantized to the padded
    widths, so the output is the unpadded one (equal, since every added product is an exact zero)."""
    x, w13p, w13s, w2p, w2s, wts, ids = args = _problem(m=20, h=160, i=96, e=4, top_k=2, device=device)
    padded = (x, *pad_mxfp4_k(w13p, w13s, 256), *pad_mxfp4_k(w2p, w2s, 128), wts, ids)
    config = {"gate_up": gate_up, "down": down}
    out = fp4_prefill_moe(*padded, config=config)
    assert torch.equal(out, fp4_prefill_moe(*args, config=config))
    assert torch.equal(fp4_prefill_moe_reference(*padded), fp4_prefill_moe_reference(*args))
    assert _rel(out, fp4_prefill_moe_reference(*args)) < 1e-2


def test_pad_mxfp4_k_appends_zero_codes():
    g = torch.Generator().manual_seed(3)
    packed, scale = quantize_mxfp4(torch.randn(2, 8, 160, generator=g))
    pp, ps = pad_mxfp4_k(packed, scale, 256)
    assert pp.shape == (2, 8, 128) and ps.shape == (2, 8, 8)
    assert torch.equal(pp[..., :80], packed) and (pp[..., 80:] == 0).all()
    assert torch.equal(ps[..., :5], scale) and (ps[..., 5:] == scale.amax(-1, keepdim=True)).all()
    for k in (128, 200, 256.0):
        with pytest.raises(ValueError, match="k must be"):
            pad_mxfp4_k(packed, scale, k)
    with pytest.raises(ValueError, match="does not match"):
        pad_mxfp4_k(packed, scale[..., :4], 256)
