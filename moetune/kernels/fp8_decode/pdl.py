"""Programmatic dependent launch (PDL) for every kernel of the FP8 decode path.

Each kernel calls ``pdl_enter(PDL)`` first; each launcher passes ``**pdl_args(pdl)``. With PDL on, a
kernel's launch overlaps the kernel before it instead of following its last program (see
docs/kernels/fp8_decode.md, PDL).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moetune.device import interpreter_active


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+, a launch with ``launch_pdl``): wait until the previous
    kernel's writes are visible, then let the next kernel's programs launch and wait the same way, so
    launches overlap the kernel before instead of following its last program. Nothing without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


PDL_MIN_CAPABILITY = (9, 0)


def resolve_pdl(pdl: bool | None, like: torch.Tensor) -> bool:
    """Whether the path launches with PDL: ``pdl`` when given, else on for sm_90 and newer. The layer and
    the tuner's spec both ask here, so a candidate is timed with the launches it serves with."""
    if pdl is None:
        return like.is_cuda and torch.cuda.get_device_capability(like.device) >= PDL_MIN_CAPABILITY
    if not isinstance(pdl, bool):
        raise ValueError(f"pdl must be True, False or None, got {pdl!r}")
    return pdl


def pdl_args(pdl: bool) -> dict[str, bool]:
    """Kernel arguments for programmatic dependent launch (``pdl_enter``); the interpreter has no
    concurrent kernels, so it always runs without."""
    on = bool(pdl) and not interpreter_active()
    return {"PDL": on, "launch_pdl": on}
