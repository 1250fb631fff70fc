"""moetune: Triton MoE kernels and the tuner that picks their tiles per GPU and route density."""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "fp8_decode_moe": "moetune.kernels.fp8_decode",
    "fp4_prefill_moe": "moetune.kernels.fp4_prefill",
    "gather_rows_with_scales": "moetune.kernels.gather_rows",
    "pick_config": "moetune.picker",
    "KernelSpec": "moetune.spec",
    "register": "moetune.spec",
}


def __getattr__(name: str):
    # Lazy, so `import moetune` stays cheap and never imports triton before the
    # caller had a chance to set TRITON_INTERPRET.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moetune' has no attribute {name!r}")


__all__ = sorted(_LAZY) + ["__version__"]
