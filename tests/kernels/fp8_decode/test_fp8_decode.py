"""FP8 block-scale decode path against its fp32 reference, through the Triton interpreter.

Shapes are small (H 256-300, I 128-200, E <= 8) and tiles wide, because the interpreter
pays per program.
"""

import math

import pytest
import torch
from conftest import DEVICE

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp8_decode.align import align_routes, max_blocks
from moetune.kernels.fp8_decode.config import check_gemm_config
from moetune.kernels.fp8_decode.epilogue import gated_activation_rows
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.layer import decode_moe_into, fp8_decode_moe, layer_buffers
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
from moetune.quant.fp8_block import quantize_fp8_block
from moetune.routing import make_routes

TOL = 1e-2
FAST = {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256}
FAST_CFG = {"gate_up": FAST, "down": FAST}


def make_layer(M=3, H=300, I=200, E=6, top_k=4, dtype=torch.bfloat16, active=1.0, seed=0, device=DEVICE):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(M, H, generator=g, device=device).to(dtype)
    w13, s13 = quantize_fp8_block(torch.randn(E, 2 * I, H, generator=g, device=device) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(E, H, I, generator=g, device=device) * 0.05)
    ids, rw = make_routes(M, top_k, E, active_fraction=active, generator=g, device=device)
    return [x, w13, s13, w2, s2, rw, ids]


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def layer():
    return make_layer(M=2, active=5 / 8)


# ---- tile configs, both algorithms ------------------------------------------------------------
CONFIGS = [
    {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128},
    {"ALGO": "route", "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "SPLIT_K": 2},
    {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 512, "num_warps": 8},
    {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "num_stages": 3},
    {"ALGO": "grouped", "BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "SPLIT_K": 2},
    {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "SWAP_AB": 1},
    {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "SPLIT_K": 3,
     "SWAP_AB": 1},
]


# CONFIGS[6] (grouped, SPLIT_K 3, SWAP_AB) runs against the reference in test_poisoned_buffers_are_overwritten
@pytest.mark.parametrize("cfg", CONFIGS[:6], ids=lambda c: "-".join(f"{k[-1]}{v}" for k, v in c.items()))
def test_tile_configs(layer, cfg):
    ref = fp8_decode_moe_reference(*layer)
    out = fp8_decode_moe(*layer, config={"gate_up": cfg, "down": cfg})
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert rel_err(out, ref) < TOL


def test_picker_default(layer):
    """config=None: the picker's choice (mixed algorithms run in test_expert_count_and_top_k)."""
    assert rel_err(fp8_decode_moe(*layer), fp8_decode_moe_reference(*layer)) < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_dtypes(dtype):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, dtype=dtype, seed=1)
    cfg = {"gate_up": FAST, "down": CONFIGS[3]}
    out = fp8_decode_moe(*args, config=cfg)
    assert out.dtype == dtype
    assert rel_err(out, fp8_decode_moe_reference(*args)) < TOL


def test_noncontiguous_views_and_padded_scales():
    x, w13, s13, w2, s2, rw, ids = make_layer(M=2, H=300, I=200, E=4, top_k=2, seed=2)
    ref = fp8_decode_moe_reference(x, w13, s13, w2, s2, rw, ids)
    x_view = torch.zeros(2, 2 * 300, dtype=x.dtype, device=DEVICE)[:, ::2]
    x_view.copy_(x)
    w13_view = w13.transpose(1, 2).contiguous().transpose(1, 2)  # K no longer the unit stride
    w2_view = torch.zeros(4, 300, 256, dtype=w2.dtype, device=DEVICE)[:, :, :200]
    w2_view.copy_(w2)
    s13_pad = torch.full((4, s13.shape[1], s13.shape[2] + 3), float("nan"), device=DEVICE)
    s13_pad[:, :, : s13.shape[2]] = s13
    s2_pad = torch.full((4, s2.shape[1], s2.shape[2] + 1), float("nan"), device=DEVICE)
    s2_pad = s2_pad[:, :, :-1]  # a strided view too
    s2_pad[:, :, : s2.shape[2]] = s2
    assert not x_view.is_contiguous() and not w13_view.is_contiguous() and not w2_view.is_contiguous()
    for cfg in (FAST, CONFIGS[5]):
        out = fp8_decode_moe(x_view, w13_view, s13_pad, w2_view, s2_pad, rw, ids,
                               config={"gate_up": cfg, "down": cfg})
        assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("activation,limit", [("silu", None), ("silu", 0.3), ("gelu_tanh", None),
                                              ("swiglu", None), ("swiglu", 0.3)])
def test_activation_kernel(activation, limit, device):
    g = torch.Generator(device).manual_seed(3)
    routes, inter = 6, 200
    gu = torch.randn(2, routes, 2 * inter, generator=g, device=device)  # two K-split partials
    ids = torch.tensor([0, -1, 3, 2, -1, 1], dtype=torch.int32, device=device)
    gu[:, 1] = float("nan")  # inactive rows are never read
    out = torch.full((routes, inter), float("nan"), device=device)
    gated_activation_rows(gu, ids, out, activation, limit)
    total = gu.sum(0)
    ref = gated_activation(total[:, :inter], total[:, inter:], activation, limit)
    ref[ids < 0] = 0
    assert torch.equal(out[ids < 0], torch.zeros(2, inter, device=device))
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_layer_with_swiglu_limit():
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, seed=4)
    kw = dict(activation="swiglu", swiglu_limit=0.5)
    out = fp8_decode_moe(*args, config=FAST_CFG, **kw)
    assert rel_err(out, fp8_decode_moe_reference(*args, **kw)) < TOL


@pytest.mark.parametrize("E,top_k,M", [(1, 1, 3), (8, 8, 2)])
def test_expert_count_and_top_k(E, top_k, M):
    args = make_layer(M=M, H=256, I=128, E=E, top_k=top_k, seed=5)
    ref = fp8_decode_moe_reference(*args)
    cfg = {"gate_up": {**CONFIGS[3], "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256}, "down": FAST}
    assert rel_err(fp8_decode_moe(*args, config=cfg), ref) < TOL


# ---- inactive routes ---------------------------------------------------------------------------
def poison_unused(args):
    """NaN bytes in every expert no active route uses, in their scales, in inactive routing weights,
    and in the activation rows of tokens with no active route."""
    x, w13, s13, w2, s2, rw, ids = [a.clone() for a in args]
    used = set(ids[ids >= 0].tolist())
    for e in range(w13.shape[0]):
        if e not in used:
            w13[e].view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
            w2[e].view(torch.uint8).fill_(0xFF)
            s13[e] = float("nan")
            s2[e] = float("nan")
    rw[ids < 0] = float("nan")
    x[(ids < 0).all(dim=1)] = float("nan")
    return [x, w13, s13, w2, s2, rw, ids]


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[4], CONFIGS[5]],
                         ids=["route-split", "grouped-split", "grouped-swap"])
def test_mixed_inactive_routes_never_read(cfg):
    args = make_layer(M=3, H=256, I=128, E=8, top_k=3, seed=6)
    ids = args[6]
    ids[0, 1:] = -1
    ids[1, :] = -1  # a token with no GPU route at all
    ids[2, 0] = -1
    args[5][ids < 0] = 0.0
    poisoned = poison_unused(args)
    ref = fp8_decode_moe_reference(*args)  # the same routing with those routes removed
    out = fp8_decode_moe(*poisoned, config={"gate_up": cfg, "down": cfg})
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert rel_err(out, ref) < TOL


@pytest.mark.parametrize("cfg", [FAST, CONFIGS[4]], ids=["route", "grouped"])
def test_all_inactive_is_exactly_zero(cfg):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=2, seed=7)
    args[6].fill_(-1)
    poisoned = poison_unused(args)
    out = fp8_decode_moe(*poisoned, config={"gate_up": cfg, "down": cfg})
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[6]], ids=["route-split", "grouped-split-swap"])
def test_poisoned_buffers_are_overwritten(cfg, device):
    args = make_layer(M=2, H=256, I=128, E=4, top_k=4, active=0.5, seed=8)
    conf = {"gate_up": check_gemm_config(cfg), "down": check_gemm_config(cfg)}
    bufs = layer_buffers(2, 4, 256, 128, torch.bfloat16, conf, device)
    for t in bufs.values():
        t.fill_(float("nan"))
    out = decode_moe_into(*args, conf, bufs)
    # active routes' rows written; inactive ones' left as they were: no kernel writes or reads them
    active = args[6].reshape(-1) >= 0
    for name in ("gate_up", "down"):
        assert torch.isfinite(bufs[name][:, active]).all() and torch.isnan(bufs[name][:, ~active]).all()
    assert torch.isfinite(bufs["act"][active]).all() and torch.isnan(bufs["act"][~active]).all()
    assert rel_err(out, fp8_decode_moe_reference(*args)) < TOL
    # one GEMM alone into a plain [R, N] buffer: partials added, every element written
    x, w13, s13, _, _, _, ids = args
    gu = torch.full((8, 256), float("nan"), device=device)
    fp8_block_gemm(x, w13, s13, ids, gu, cfg, a_row_div=4)
    assert torch.isfinite(gu).all()
    assert torch.equal(gu[ids.reshape(-1) < 0], torch.zeros(4, 256, device=device))


def test_grouped_handles_more_routes_than_a_block():
    args = make_layer(M=20, H=256, I=128, E=2, top_k=2, seed=10)  # 20 routes per expert > BLOCK_SIZE_M 16
    cfg = {"ALGO": "grouped", "BLOCK_SIZE_N": 256, "SWAP_AB": 1}
    out = fp8_decode_moe(*args, config={"gate_up": cfg, "down": {**cfg, "SWAP_AB": 0}})
    assert rel_err(out, fp8_decode_moe_reference(*args)) < TOL


def test_align_routes_buckets_every_active_route_once(device):
    ids = torch.tensor([[0, 3, -1, 3], [5, -1, 0, 2], [3, 3, 1, -1]], dtype=torch.int32, device=device)
    sorted_ids, block_expert, used = align_routes(ids, 6, 16)
    assert block_expert.numel() == max_blocks(12, 6, 16)
    assert used.tolist() == [int((block_expert >= 0).sum())] == [5]  # experts 0, 1, 2, 3, 5: one block each
    flat = ids.reshape(-1)
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_ids[b * 16:(b + 1) * 16]
        if e < 0:
            assert (rows == 12).all()
            continue
        real = rows[rows < 12]
        assert (flat[real.long()] == e).all()
        seen += real.tolist()
    assert sorted(seen) == (flat >= 0).nonzero().flatten().tolist()


# ---- bad input -------------------------------------------------------------------------------
def _bad(args, **changes):
    names = ["x", "w13", "w13_scale", "w2", "w2_scale", "topk_weights", "topk_ids"]
    d = dict(zip(names, args, strict=True))
    d.update(changes)
    return [d[n] for n in names]


@pytest.fixture(scope="module")
def small():
    return make_layer(M=2, H=256, I=128, E=4, top_k=2, seed=9)


BAD = [
    (lambda a: _bad(a, x=a[0].int()), "x must be"),
    (lambda a: _bad(a, x=a[0][None]), "x must have rank 2"),
    (lambda a: _bad(a, w13=a[1].float()), "w13 must be torch.float8_e4m3fn"),
    (lambda a: _bad(a, w2=a[3][:, :-1]), "w2 must be"),
    (lambda a: _bad(a, w13=a[1][:, :-1]), "w13 must be"),
    (lambda a: _bad(a, x=a[0][:, :-1]), "w13 must be"),
    (lambda a: _bad(a, w13_scale=a[2][:, :, :1]), "w13_scale must be"),
    (lambda a: _bad(a, w2_scale=a[4].half()), "w2_scale must be float32 or bfloat16"),
    (lambda a: _bad(a, topk_weights=a[5].double()), "topk_weights must be float32"),
    (lambda a: _bad(a, topk_ids=a[6].float()), "topk_ids must be int32 or int64"),
    (lambda a: _bad(a, topk_ids=a[6][:1]), "topk_ids must be"),
    (lambda a: _bad(a, topk_weights=a[5][:, :1]), "topk_weights must have"),
    (lambda a: _bad(a, w2="nope"), "w2 must be a torch.Tensor"),
    (lambda a: _bad(a, topk_ids=a[6].to("meta")), "topk_ids is on meta"),
]


@pytest.mark.parametrize("make,msg", BAD, ids=[m for _, m in BAD])
def test_bad_tensors(small, make, msg):
    with pytest.raises(ValueError, match=msg):
        fp8_decode_moe(*make(small), config=FAST_CFG)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(activation="relu"), "activation must be one of"),
    (dict(swiglu_limit=-1.0), "swiglu_limit"),
    (dict(config={"gate": {}}), "unknown key"),
    (dict(config=[1]), "config must be"),
    (dict(config={"gate_up": {"BLOCK_M": 16}}), "unknown key"),
    (dict(config={"gate_up": {"BLOCK_SIZE_K": 64}}), "BLOCK_SIZE_K"),
    (dict(config={"down": {"BLOCK_SIZE_K": 384}}), "BLOCK_SIZE_K"),
    (dict(config={"down": {"BLOCK_SIZE_N": 48}}), "BLOCK_SIZE_N"),
    (dict(config={"down": {"BLOCK_SIZE_N": 256}}), "BLOCK_SIZE_N"),  # route tiles stay in one scale row
    (dict(config={"down": {"ALGO": "dense"}}), "ALGO"),
    (dict(config={"down": {"SPLIT_K": 0}}), "SPLIT_K"),
    (dict(config={"down": {"SWAP_AB": 1}}), "SWAP_AB"),
    (dict(config={"down": {"ALGO": "grouped", "SWAP_AB": 2}}), "SWAP_AB"),
    (dict(config={"down": {"num_warps": 3}}), "num_warps"),
    (dict(config={"gate_up": {"ALGO": "grouped", "BLOCK_SIZE_M": 24}}), "BLOCK_SIZE_M"),
])
def test_bad_options(small, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        fp8_decode_moe(*small, **kwargs)


def test_validate_ids_and_empty_batch(small):
    bad_ids = small[6].clone()
    bad_ids[0, 0] = 4
    args = _bad(small, topk_ids=bad_ids)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[-1, 4\)"):
        fp8_decode_moe(*args, config=FAST_CFG, validate=True)
    bad_ids[0, 0] = -2
    with pytest.raises(ValueError, match="topk_ids must lie"):
        fp8_decode_moe(*_bad(small, topk_ids=bad_ids), config=FAST_CFG, validate=True)
    x, w13, s13, w2, s2, rw, ids = small
    out = fp8_decode_moe(x[:0], w13, s13, w2, s2, rw[:0], ids[:0], config=FAST_CFG, validate=True)
    assert out.shape == (0, 256) and out.dtype == x.dtype
    assert math.isfinite(rel_err(fp8_decode_moe(*small, config=FAST_CFG, validate=True),
                                 fp8_decode_moe_reference(*small)))


def test_public_exports():
    import moetune
    from moetune import reference

    assert moetune.fp8_decode_moe is fp8_decode_moe
    assert reference.fp8_decode_moe is fp8_decode_moe_reference
