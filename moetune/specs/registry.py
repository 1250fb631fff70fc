"""The tuner's registry of kernel specs: the built-in ones, registered ones and the entry points'."""

from __future__ import annotations

import importlib

from moetune.kernels import rules
from moetune.specs.base import KernelSpec

BUILTIN_SPECS = ("moetune.specs.fp8_decode", "moetune.specs.fp4_prefill", "moetune.specs.gather_rows")
_REGISTRY: dict[str, KernelSpec] = {}
_LOADED = False


def register(spec: KernelSpec) -> KernelSpec:
    """Make ``spec`` known to the tuner and, for its op name, to the picker."""
    rules.register_rules(spec)
    _REGISTRY[spec.name] = spec
    return spec


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for module in BUILTIN_SPECS:
        for spec in importlib.import_module(module).SPECS:
            register(spec)
    for obj in rules.plugins():
        if isinstance(obj, KernelSpec):
            _REGISTRY[obj.name] = obj


def get_spec(name: str) -> KernelSpec:
    _load()
    if name not in _REGISTRY:
        raise ValueError(rules.unknown_kernel(name))
    return _REGISTRY[name]


def all_specs() -> list[KernelSpec]:
    _load()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]
