"""Kernel rules and plugins: a plugin that fails to load is skipped with one warning naming it; the
built-in kernels, the picker and the other plugins keep working; asking for its kernel says why."""

from __future__ import annotations

import importlib.metadata
import warnings

import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.kernels import rules
from moetune.specs import registry
from moetune.specs.base import KernelSpec
from moetune.tables import picker


class _Good(KernelSpec):
    name = "goodplugin.gemm"
    space = {"BLOCK_SIZE_N": [32, 64]}
    default = {"BLOCK_SIZE_N": 32}


class _EntryPoint:
    def __init__(self, name, load):
        self.name, self.value, self._load = name, f"{name}_pkg:SPEC", load

    def load(self):
        return self._load()


def _broken():
    raise ImportError("No module named 'brokenplugin_dep'")


@pytest.fixture
def plugins(monkeypatch):
    """Entry points: a broken plugin listed before a good one; fresh registries."""
    real = importlib.metadata.entry_points
    eps = [_EntryPoint("brokenplugin", _broken), _EntryPoint("goodplugin", _Good)]

    def fake(**kwargs):
        return eps if kwargs.get("group") == rules.ENTRY_POINT_GROUP else real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setattr(rules, "_RULES", {})
    monkeypatch.setattr(rules, "_PLUGINS", None)
    monkeypatch.setattr(rules, "PLUGIN_ERRORS", {})
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_LOADED", False)
    picker.clear_cache()
    yield
    picker.clear_cache()


def test_a_broken_plugin_is_skipped_with_one_warning(plugins):
    match = "skipping kernel plugin 'brokenplugin'.*brokenplugin_dep"
    with pytest.warns(RuntimeWarning, match=match) as caught:
        names = [s.name for s in registry.all_specs()]
        registry.all_specs()
    assert len([w for w in caught if "brokenplugin" in str(w.message)]) == 1
    assert "goodplugin.gemm" in names  # listed after the broken one, still there
    for builtin in ("fp8_decode.gate_up", "fp8_decode.down", "fp4_prefill.gate_up", "fp4_prefill.down",
                    "gather_rows"):
        assert builtin in names


def test_built_in_picks_do_not_load_plugins_and_never_raise(plugins):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a built-in pick must not even touch the plugins
        p = picker.pick_config_with_source("fp8_decode.gate_up", dict(E=256, N=512, K=7168, top_k=8), 8,
                                           device="NVIDIA H200")
    assert p.source == "device"
    with pytest.warns(RuntimeWarning, match="brokenplugin"):
        assert picker.pick_config("goodplugin.gemm", dict(E=8, N=64, K=64, top_k=2), 4,
                                  device="NVIDIA H200") == {"BLOCK_SIZE_N": 32}


def test_asking_for_a_missing_kernel_names_the_broken_plugin(plugins):
    with pytest.warns(RuntimeWarning):
        with pytest.raises(ValueError, match="unknown kernel 'brokenplugin.gemm'.*brokenplugin.*ImportError"):
            registry.get_spec("brokenplugin.gemm")


def test_sweep_of_the_broken_plugins_kernel_says_why(plugins, tmp_path):
    with pytest.warns(RuntimeWarning):
        res = CliRunner().invoke(app, ["sweep", "--kernel", "brokenplugin.gemm", "--model", "tiny",
                                       "--tokens", "1", "--db", str(tmp_path / "r.sqlite")])
    assert res.exit_code != 0
    assert "brokenplugin" in res.output and "ImportError" in res.output
    assert "Traceback" not in res.output
