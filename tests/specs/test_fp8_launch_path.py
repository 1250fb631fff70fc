"""The tuner times an FP8 decode GEMM through the launcher the layer calls, with the same PDL setting."""

from __future__ import annotations

import pytest
import torch

from moetune.kernels.fp8_decode import gemm as gemm_mod
from moetune.kernels.fp8_decode import layer as layer_mod
from moetune.kernels.fp8_decode import pdl as pdl_mod
from moetune.specs import fp8_decode as spec_mod
from moetune.specs.registry import get_spec


@pytest.mark.parametrize("serving_pdl", [True, False])
def test_spec_and_layer_launch_the_same_gemm_with_the_same_pdl(monkeypatch, serving_pdl, device):
    calls = []
    real = gemm_mod.fp8_block_gemm

    def spy(*args, **kwargs):
        calls.append((kwargs["pdl"], kwargs["fill_inactive"]))
        return real(*args, **kwargs)

    # One launcher: both the layer and the spec call gemm.fp8_block_gemm (by the name they import).
    assert spec_mod.fp8_block_gemm is real and layer_mod.fp8_block_gemm is real
    monkeypatch.setattr(spec_mod, "fp8_block_gemm", spy)
    monkeypatch.setattr(layer_mod, "fp8_block_gemm", spy)
    # What the layer resolves its default (pdl=None) to on a device; the interpreter turns the launch
    # arguments off either way, so this checks the decision, not the hardware.
    monkeypatch.setattr(spec_mod, "resolve_pdl", lambda pdl, like: serving_pdl if pdl is None else pdl)
    monkeypatch.setattr(layer_mod, "resolve_pdl", lambda pdl, like: serving_pdl if pdl is None else pdl)

    spec = get_spec("fp8_decode.gate_up")
    shape = {"E": 4, "N": 64, "K": 256, "top_k": 2}
    problem = spec.problem(shape, tokens=2)
    inputs = spec.make_inputs(problem, device, seed=0)
    spec.run(inputs, dict(spec.default))
    assert calls == [(serving_pdl, False)]  # inactive rows left unwritten, as the layer leaves them

    g = torch.Generator(device).manual_seed(0)
    from moetune.quant import quantize_fp8_block

    x = torch.randn(2, 256, generator=g, device=device).to(torch.bfloat16)
    w13, s13 = quantize_fp8_block(torch.randn(4, 64, 256, generator=g, device=device) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(4, 256, 32, generator=g, device=device) * 0.05)
    ids = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=device)
    rw = torch.rand(2, 2, generator=g, device=device)
    layer_mod.fp8_decode_moe(x, w13, s13, w2, s2, rw, ids)
    assert calls[1:] == [(serving_pdl, False), (serving_pdl, False)]  # gate/up and down


def test_resolve_pdl_rejects_non_bools():
    with pytest.raises(ValueError, match="pdl must be True, False or None"):
        pdl_mod.resolve_pdl(1, torch.zeros(1, device="cpu"))
    assert pdl_mod.resolve_pdl(None, torch.zeros(1, device="cpu")) is False  # a CPU tensor


@pytest.mark.parametrize("cfg", [{"ALGO": "route", "SPLIT_K": 2},
                                 {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "SPLIT_K": 1}])
def test_gemm_leaves_inactive_rows_unwritten_only_when_asked(cfg, device):
    from moetune.quant import quantize_fp8_block

    g = torch.Generator(device).manual_seed(3)
    x = torch.randn(3, 256, generator=g, device=device).to(torch.bfloat16)
    w, s = quantize_fp8_block(torch.randn(4, 64, 256, generator=g, device=device) * 0.05)
    ids = torch.tensor([[0, -1], [-1, -1], [3, 1]], dtype=torch.int32, device=device)
    split = cfg["SPLIT_K"]
    inactive = ids.reshape(-1) < 0
    for fill in (True, False):
        out = torch.full((split, 6, 64), float("nan"), device=device)
        gemm_mod.fp8_block_gemm(x, w, s, ids, out, cfg, a_row_div=2, fill_inactive=fill)
        assert torch.isfinite(out[:, ~inactive]).all()
        if fill:
            assert (out[:, inactive] == 0).all()
        else:
            assert torch.isnan(out[:, inactive]).all()


def test_spec_check_still_sees_zeros_for_inactive_routes(device):
    spec = get_spec("fp8_decode.down")
    problem = spec.problem({"E": 4, "N": 64, "K": 256, "top_k": 4}, tokens=2, active_fraction=0.5)
    inputs = spec.make_inputs(problem, device, seed=1)
    spec.poison(inputs)
    cfg = dict(spec.default)
    spec.run(inputs, cfg)
    spec.collect(inputs, cfg)
    ids = inputs.tensors["topk_ids"].reshape(-1)
    assert (ids < 0).any()
    assert (inputs.outputs[0][ids < 0] == 0).all()
    assert spec.passes(spec.error(inputs.outputs, spec.reference(inputs)))
