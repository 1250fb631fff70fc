"""A tiny spec and builders shared by the tables, picker, export and CLI tests.

The toy op needs no kernel: the tables code only uses a spec's names, space, default,
shape normalization, config checks, constraint and heuristic. It is registered only while a
test that imports ``toy_registered`` runs, so other suites never see it in ``all_specs()``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from moetune.kernels import rules
from moetune.specs import registry as spec_module
from moetune.specs.base import KernelSpec
from moetune.specs.registry import all_specs
from moetune.tables import format as tables
from moetune.tables import picker

KERNEL = "toy.gemm"
SHAPE = {"E": 8, "N": 64, "K": 128, "top_k": 2, "dtype": "bfloat16"}
DEVICE = "NVIDIA Toy 9000"


class ToySpec(KernelSpec):
    name = KERNEL
    space = {"BLOCK_SIZE_M": [16, 32, 64, 128], "BLOCK_SIZE_K": [64, 128], "num_warps": [4, 8]}
    default = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_K": 64, "num_warps": 8}
    shape_defaults = {"dtype": "bfloat16"}

    def check_config(self, config):
        super().check_config(config)
        for key, value in config.items():
            if value not in self.space[key]:
                raise ValueError(f"{self.name}: config {key}={value!r} is not one of {self.space[key]}")

    def constraint(self, config, problem, device):
        why = super().constraint(config, problem, device)
        if why is None and config.get("BLOCK_SIZE_M", 64) > 32 * max(1.0, problem.density):
            why = f"BLOCK_SIZE_M {config['BLOCK_SIZE_M']} is far over {problem.density:g} rows per expert"
        return why

    def heuristic(self, shape, routes, arch):
        if arch in ("sm_89", "sm_86", "sm_80"):
            d = routes / shape["E"]
            return {"BLOCK_SIZE_M": 16 if d <= 8 else 32 if d <= 32 else 128, "BLOCK_SIZE_K": 128,
                    "num_warps": 4}
        return dict(self.default)


SPEC = ToySpec()


@pytest.fixture(autouse=True)
def toy_registered(monkeypatch):
    """The toy spec in the registry for one test (autouse wherever this fixture is imported)."""
    all_specs()  # the built-in specs first, so loading them later cannot drop the toy
    monkeypatch.setitem(spec_module._REGISTRY, KERNEL, SPEC)
    monkeypatch.setitem(rules._RULES, KERNEL, SPEC)
    picker.clear_cache()
    yield SPEC
    picker.clear_cache()


def cfg(bm: int, bk: int = 128, w: int = 4) -> dict[str, Any]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_K": bk, "num_warps": w}


def entry(density: float, config: dict, time_ms: float = 1.0, default_ms: float = 2.0, **extra) -> dict:
    e = {"density": density, "config": config, "time_ms": time_ms, "default_ms": default_ms,
         "speedup": default_ms / time_ms, "spread": 0.01, "error": 0.001, "roofline_frac": 0.5}
    e.update(extra)
    return e


def table(entries: list[dict], *, arch: str = "sm_90", device: str | None = DEVICE,
          shape: dict | None = None) -> dict:
    """A valid table document (the device's own when ``device`` is set, else an arch table)."""
    return {
        "format": tables.FORMAT, "version": tables.VERSION, "kernel": KERNEL, "arch": arch,
        "device": device, "device_names": [device or DEVICE], "shape": dict(shape or SHAPE),
        "default": dict(SPEC.default), "strategy": ["exhaustive"],
        "candidates": {"measured": 10, "ok": 8, "rejected": {"inaccurate": 2}},
        "versions": {"moetune": "0.1.0", "triton": "3.6.0", "torch": "2.11", "cuda": "12.8"},
        "date": "2026-11-29", "entries": copy.deepcopy(entries),
    }


def put(root, doc: dict) -> Any:
    """Write ``doc`` where the picker looks for it under ``root``; returns the path."""
    path = tables.table_path(root, doc["arch"], doc["kernel"], doc["shape"], device=doc["device"])
    tables.write(path, doc)
    return path


def row(config: dict, time_ms: float | None, *, tokens: int = 4, active_fraction: float = 1.0,
        routing: str = "uniform", device: str = DEVICE, arch: str = "sm_90", status: str = "ok",
        spread: float = 0.01, error: float = 0.001, shape: dict | None = None, kernel: str = KERNEL,
        **extra) -> dict:
    """One store row as the sweep writes it."""
    shape = dict(shape or SHAPE)
    routes = round(tokens * shape["top_k"] * active_fraction)
    r = {"sweep_id": "test", "kernel": kernel, "device_name": device, "arch": arch,
         "moetune_version": "0.1.0", "triton_version": "3.6.0", "torch_version": "2.11.0",
         "cuda_version": "12.8", "shape": shape,
         "tokens": tokens, "routes": routes, "active_fraction": active_fraction, "routing": routing,
         "density": routes / shape["E"], "config": {**SPEC.default, **config}, "status": status,
         "error": error, "time_ms": time_ms, "min_ms": time_ms and time_ms * 0.98, "spread": spread,
         "n_runs": 50, "roofline_frac": 0.4, "strategy": "exhaustive", "timestamp": "2026-11-29T12:00:00Z"}
    r.update(extra)
    return r
