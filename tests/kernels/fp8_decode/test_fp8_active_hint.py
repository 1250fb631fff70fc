"""The static active-share hint: the picker is asked for the active routes; the result never changes."""

from __future__ import annotations

import pytest
import torch

from moetune.kernels.fp8_decode import layer as layer_mod
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
from moetune.quant import quantize_fp8_block


def _layer(device, m=4, top_k=4, e=6):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(m, 256, generator=g).to(device, torch.bfloat16)
    w13, s13 = quantize_fp8_block(torch.randn(e, 256, 256, generator=g).to(device) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(e, 256, 128, generator=g).to(device) * 0.05)
    ids = torch.randperm(e, generator=g)[:top_k].repeat(m, 1).to(device, torch.int32)
    ids[:, 1:] = -1  # a quarter of the slots active
    rw = torch.rand(m, top_k, generator=g).to(device)
    return x, w13, s13, w2, s2, rw, ids


@pytest.mark.parametrize("hint,asked", [(None, 16), (0.25, 4), (0.0, 4)])
def test_the_picker_is_asked_for_the_hinted_active_routes(monkeypatch, hint, asked, device):
    import moetune.tables.picker as picker

    seen = []
    real = picker.pick_config
    monkeypatch.setattr(picker, "pick_config", lambda k, s, r, **kw: seen.append(r) or real(k, s, r, **kw))
    args = _layer(device)
    out = layer_mod.fp8_decode_moe(*args, active_share=hint)
    assert seen == [asked, asked]  # both GEMMs (no active route expected: one token's, top_k)
    ref = fp8_decode_moe_reference(*args).float()
    assert ((out.float() - ref).norm() / ref.norm()) < 1e-2


def test_a_bad_hint_is_refused_naming_it(device):
    with pytest.raises(ValueError, match="active_share"):
        layer_mod.fp8_decode_moe(*_layer(device), active_share=2)


@pytest.mark.parametrize("hint", [None, 0.25, 0.0])
def test_a_hint_of_no_active_route_loops_the_picked_tiles(monkeypatch, hint, device):
    seen = []
    real = layer_mod.decode_moe_into
    monkeypatch.setattr(layer_mod, "decode_moe_into",
                        lambda *a, **kw: seen.append(a[7]) or real(*a, **kw))
    args = _layer(device)
    args[-1].fill_(-1)  # every slot inactive: the output is zero whatever the tiles
    out = layer_mod.fp8_decode_moe(*args, active_share=hint)
    want = layer_mod.IDLE_PERSISTENT if hint == 0 else 0
    assert [seen[0][g]["PERSISTENT"] for g in ("gate_up", "down")] == [want, want]
    assert torch.equal(out, torch.zeros_like(out))


def test_an_idle_hint_leaves_given_configs_as_they_are():
    given = {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64}
    cfg = layer_mod.resolve_config({"down": given}, {"gate_up": {"E": 6, "N": 512, "K": 256, "top_k": 4,
                                                                 "dtype": "bfloat16"}}, 16, idle=True)
    assert cfg["down"]["PERSISTENT"] == 0
    assert cfg["gate_up"]["PERSISTENT"] == layer_mod.IDLE_PERSISTENT


def test_an_idle_hint_swaps_a_grouped_pick_for_the_route_kernels(monkeypatch, device):
    import moetune.tables.picker as picker

    grouped = {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "SWAP_AB": 1, "A_FP8": 2}
    monkeypatch.setattr(picker, "pick_config", lambda k, s, r, **kw: dict(grouped))
    shapes = {g: {"E": 6, "N": 256, "K": 256, "top_k": 4, "dtype": "bfloat16"} for g in ("gate_up", "down")}
    cfg = layer_mod.resolve_config(None, shapes, 16, idle=True)
    for g in ("gate_up", "down"):
        assert cfg[g]["ALGO"] == "route" and cfg[g]["A_FP8"] == 0
        assert cfg[g]["PERSISTENT"] == layer_mod.IDLE_PERSISTENT
    assert layer_mod.resolve_config(None, shapes, 16)["down"]["ALGO"] == "grouped"  # no hint: as picked
    args = _layer(device)  # a wrong hint (a quarter of the slots active) still gives the exact result
    out = layer_mod.fp8_decode_moe(*args, active_share=0)
    ref = fp8_decode_moe_reference(*args).float()
    assert ((out.float() - ref).norm() / ref.norm()) < 1e-2
