"""The registry: built-in specs load, third-party specs arrive through the entry-point group."""

from __future__ import annotations

import pytest

from moetune.kernels import rules
from moetune.specs import registry as spec_mod
from moetune.specs.base import KernelSpec


class _ThirdParty(KernelSpec):
    name = "thirdparty.gemm"
    space = {"BLOCK_SIZE_N": [32, 64]}
    default = {"BLOCK_SIZE_N": 32}


class _EntryPoint:
    def __init__(self, obj):
        self._obj = obj

    def load(self):
        return self._obj


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry copy with built-ins loaded, marked unloaded so entry points are read again."""
    spec_mod.all_specs()
    monkeypatch.setattr(spec_mod, "_REGISTRY", dict(spec_mod._REGISTRY))
    monkeypatch.setattr(spec_mod, "_LOADED", False)
    monkeypatch.setattr(rules, "_RULES", dict(rules._RULES))
    monkeypatch.setattr(rules, "_PLUGINS", None)
    monkeypatch.setattr(rules, "PLUGIN_ERRORS", {})


@pytest.mark.parametrize("exported", [_ThirdParty(), _ThirdParty, [_ThirdParty()]])
def test_entry_point_specs_register(fresh_registry, monkeypatch, exported):
    import importlib.metadata

    real = importlib.metadata.entry_points

    def fake_entry_points(**kwargs):
        if kwargs.get("group") == "moetune.kernels":
            return [_EntryPoint(exported)]
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    names = [s.name for s in spec_mod.all_specs()]
    assert "thirdparty.gemm" in names
    for builtin in ("fp8_decode.gate_up", "fp8_decode.down", "fp4_prefill.gate_up", "fp4_prefill.down",
                    "gather_rows"):
        assert builtin in names
    assert spec_mod.get_spec("thirdparty.gemm").default == {"BLOCK_SIZE_N": 32}


def test_unknown_kernel_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown kernel 'nope'.*fp8_decode.gate_up"):
        spec_mod.get_spec("nope")


def test_unknown_config_key_is_pruned_with_its_name():
    s = spec_mod.get_spec("gather_rows")
    problem = s.problem({"E": 8, "N": 256, "K": 256, "top_k": 2}, tokens=4)
    from moetune.device import INTERPRETER

    reason = s.constraint({**s.default, "BLOCK_SIZE_Q": 4}, problem, INTERPRETER)
    assert reason is not None and "BLOCK_SIZE_Q" in reason


def test_config_checks_are_cached_per_config_and_still_exact():
    from moetune.device import INTERPRETER

    class Counting(_ThirdParty):
        calls = 0

        def check_config(self, config):
            type(self).calls += 1
            super().check_config(config)

    s = Counting()
    problem = s.problem({"E": 8, "N": 256, "K": 256, "top_k": 2}, tokens=4)
    for _ in range(3):  # three densities of a sweep: one check
        assert s.constraint(dict(s.default), problem, INTERPRETER) is None
        assert "BLOCK_SIZE_Q" in s.constraint({**s.default, "BLOCK_SIZE_Q": 4}, problem, INTERPRETER)
    assert Counting.calls == 2
    unhashable = {**s.default, "BLOCK_SIZE_Q": [4]}
    assert "BLOCK_SIZE_Q" in s.constraint(unhashable, problem, INTERPRETER)


def test_error_is_relative_l2_and_inf_for_any_nan_or_inf(device):
    import math

    import torch

    spec = _ThirdParty()
    ref = torch.tensor([[3.0, 0.0], [0.0, 4.0]], device=device)
    assert spec.error((ref.clone(),), (ref,)) == 0.0
    off = torch.tensor([[0.3, 0.0], [0.0, 0.4]], device=device)
    assert spec.error((ref + off,), (ref,)) == pytest.approx(0.1)
    assert spec.error((ref.to(torch.bfloat16),), (ref,)) == 0.0  # any float output dtype
    for bad in (float("nan"), float("inf"), -float("inf")):
        out = ref.clone()
        out[1, 0] = bad
        assert spec.error((out,), (ref,)) == math.inf, bad
    zeros = torch.zeros(2, 2, device=device)
    assert spec.error((zeros,), (zeros.clone(),)) == 0.0
    assert spec.error((torch.ones(2, 2, device=device),), (zeros,)) == math.inf
    shorter = torch.ones(2, device=device)
    assert spec.error((torch.ones(3, device=device),), (shorter,)) == math.inf  # shape mismatch
    assert spec.error((ref, ref + 1), (ref, ref)) == pytest.approx(2 / 5)  # the worst output counts
