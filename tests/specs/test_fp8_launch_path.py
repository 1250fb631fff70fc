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
        calls.append(kwargs["pdl"])
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
    assert calls == [serving_pdl]

    g = torch.Generator(device).manual_seed(0)
    from moetune.quant import quantize_fp8_block

    x = torch.randn(2, 256, generator=g, device=device).to(torch.bfloat16)
    w13, s13 = quantize_fp8_block(torch.randn(4, 64, 256, generator=g, device=device) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(4, 256, 32, generator=g, device=device) * 0.05)
    ids = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=device)
    rw = torch.rand(2, 2, generator=g, device=device)
    layer_mod.fp8_decode_moe(x, w13, s13, w2, s2, rw, ids)
    assert calls[1:] == [serving_pdl, serving_pdl]  # gate/up and down


def test_resolve_pdl_rejects_non_bools():
    with pytest.raises(ValueError, match="pdl must be True, False or None"):
        pdl_mod.resolve_pdl(1, torch.zeros(1, device="cpu"))
    assert pdl_mod.resolve_pdl(None, torch.zeros(1, device="cpu")) is False  # a CPU tensor
