"""PERSISTENT: a grid of a few programs per SM looping over the active routes' (route kernels) or used
M blocks' (grouped) tiles. Against the one-tile grid and the fp32 reference, with inactive routes, an
all-inactive routing, poisoned outputs, both fill_inactive modes and more tiles than programs."""

import pytest
import torch
from conftest import DEVICE
from test_fp8_decode import TOL, make_layer, poison_unused, rel_err

from moetune.device import device_info
from moetune.kernels.fp8_decode import gemm as gemm_mod
from moetune.kernels.fp8_decode.align import max_blocks
from moetune.kernels.fp8_decode.config import check_gemm_config
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.layer import fp8_decode_moe
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
from moetune.quant.fp8_block import quantize_fp8_block

TILES = {  # one per kernel: the W8A16 GEMV, the one-route tl.dot, grouped (plain and SWAP_AB, split K)
    "gemv": {"ALGO": "route", "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "SPLIT_K": 2},
    "route-dot": {"ALGO": "route", "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "A_FP8": 2, "num_stages": 2},
    "grouped": {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "A_FP8": 2},
    "grouped-swap": {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                     "SWAP_AB": 1, "A_FP8": 2, "SPLIT_K": 2},
}


def _gemm(tokens=3, n=96, k=256, e=5, top_k=3, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(tokens, k, generator=g, device=DEVICE).to(torch.bfloat16)
    w, s = quantize_fp8_block(torch.randn(e, n, k, generator=g, device=DEVICE) * 0.05)
    ids = torch.randint(0, e, (tokens, top_k), generator=g, device=DEVICE, dtype=torch.int32)
    return x, w, s, ids


def _run(x, w, s, ids, cfg, fill_inactive=True):
    split = check_gemm_config(cfg)["SPLIT_K"]
    out = torch.full((split, ids.numel(), w.shape[1]), float("nan"), device=DEVICE)
    fp8_block_gemm(x, w, s, ids, out, cfg, a_row_div=ids.shape[1], fill_inactive=fill_inactive)
    return out


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("name", TILES)
@pytest.mark.parametrize("persistent", [1, 3])
def test_same_result_as_the_one_tile_grid_with_inactive_routes(name, persistent):
    """More tiles than programs (the interpreter counts one SM): each program loops; the inactive
    routes' rows are zero with fill_inactive, untouched (still NaN) without, the active ones equal."""
    x, w, s, ids = _gemm(seed=persistent)
    ids[0, 1] = -1
    ids[2, :] = -1
    cfg = TILES[name]
    plain = _run(x, w, s, ids, cfg)
    active = (ids.reshape(-1) >= 0)
    assert (plain[:, ~active] == 0).all() and torch.isfinite(plain).all()
    looped = _run(x, w, s, ids, {**cfg, "PERSISTENT": persistent})
    assert torch.allclose(looped, plain, rtol=1e-5, atol=1e-6)
    skipped = _run(x, w, s, ids, {**cfg, "PERSISTENT": persistent}, fill_inactive=False)
    assert torch.isnan(skipped[:, ~active]).all()
    assert torch.allclose(skipped[:, active], plain[:, active], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", TILES)
def test_all_inactive_writes_nothing_or_zeros(name):
    x, w, s, ids = _gemm(tokens=2)
    ids[:] = -1
    cfg = {**TILES[name], "PERSISTENT": 2}
    assert torch.isnan(_run(x, w, s, ids, cfg, fill_inactive=False)).all()
    assert (_run(x, w, s, ids, cfg) == 0).all()


def test_persistent_grid_is_programs_per_sm(monkeypatch):
    """The grid: PERSISTENT programs per SM (one-dimensional) where that is fewer than the tiles; the
    one-tile grid otherwise, and for route kernels above PERSISTENT_MAX_ROUTES."""
    grids = []

    class Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            grids.append(grid)
            return self.kernel[grid]

    for name in ("_route_gemm_kernel", "_grouped_gemm_kernel"):
        monkeypatch.setattr(gemm_mod, name, Spy(getattr(gemm_mod, name)))
    sms = device_info(torch.device(DEVICE).index).sm_count
    x, w, s, ids = _gemm(tokens=4, n=96)  # 12 routes x 3 N tiles x 2 splits = 72 route tiles

    def want(per_sm, tiles, one_tile):
        return (per_sm * sms,) if per_sm * sms < tiles else one_tile

    _run(x, w, s, ids, {**TILES["gemv"], "PERSISTENT": 2})
    _run(x, w, s, ids, {**TILES["gemv"], "PERSISTENT": 32})
    _run(x, w, s, ids, {**TILES["grouped"], "PERSISTENT": 2})
    blocks = max_blocks(12, 5, 16) + 1  # the M blocks, then one zeroing program per 16 routes
    assert grids == [want(2, 72, (12, 3, 2)), want(32, 72, (12, 3, 2)),
                     want(2, blocks * 3, (blocks, 3, 1))]
    monkeypatch.setattr(gemm_mod, "PERSISTENT_MAX_ROUTES", 8)
    _run(x, w, s, ids, {**TILES["gemv"], "PERSISTENT": 2})
    assert grids[3] == (12, 3, 2)


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@pytest.mark.parametrize("active", [0.0, 0.5, 1.0])
def test_layer_with_persistent_tiles_matches_reference(active):
    """The whole layer with both GEMMs persistent, unused experts and inactive weights poisoned."""
    args = make_layer(M=4, H=256, I=128, E=6, top_k=3, active=active, seed=5)
    config = {"gate_up": {**TILES["grouped-swap"], "PERSISTENT": 2},
              "down": {**TILES["route-dot"], "PERSISTENT": 1}}
    out = fp8_decode_moe(*poison_unused(args), config=config)
    ref = fp8_decode_moe_reference(*args)
    if active == 0.0:
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert rel_err(out, ref) < TOL


def test_persistent_is_checked():
    for bad in (-1, 33, 1.5, True):
        with pytest.raises(ValueError, match="PERSISTENT"):
            check_gemm_config({"PERSISTENT": bad})
    with pytest.raises(ValueError, match="PERSISTENT"):
        check_gemm_config({"PERSISTENT": 2, "FUSE": 1})
