"""moetune: Triton MoE kernels and the tuner that picks their tiles per GPU and route density."""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "fp8_decode_moe": "moetune.kernels.fp8_decode.layer",
    "fp4_prefill_moe": "moetune.kernels.fp4_prefill.layer",
    "gather_rows_with_scales": "moetune.kernels.gather_rows.gather",
    "pick_config": "moetune.tables.picker",
    "pick_config_with_source": "moetune.tables.picker",
    "KernelSpec": "moetune.specs.base",
    "register": "moetune.specs.registry",
    "get_spec": "moetune.specs.registry",
    "load_moe_layer": "moetune.checkpoint",
    "MoeLayerWeights": "moetune.checkpoint",
    "tune": "moetune.tuner.api",
    "export_tables": "moetune.tuner.api",
}
# Modules reachable as attributes, e.g. ``moetune.picker.pick_config_with_source``.
_MODULES = {"picker": "moetune.tables.picker", "reference": "moetune.reference", "ops": "moetune.ops",
            "checkpoint": "moetune.checkpoint"}


def __getattr__(name: str):
    # Lazy, so `import moetune` stays cheap and never imports triton before the
    # caller had a chance to set TRITON_INTERPRET.
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'moetune' has no attribute {name!r}")


__all__ = sorted(_LAZY) + ["__version__"]
