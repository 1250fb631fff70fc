"""Argument checks of the FP4 prefill MoE, shared by the kernels (``layer``) and the torch reference."""

from __future__ import annotations

from typing import Any

import torch

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    return t


def check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                 topk_ids) -> tuple[int, int, int, int]:
    """ValueError naming the argument; returns (experts, intermediate, and the two GEMMs' K: the hidden and
    intermediate sizes, or what the weights were zero-padded to along K). The activation and its limit are
    :func:`moetune.kernels.activations.check_activation`'s."""
    _tensor("x", x, _FLOATS, 2)
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale),
                    ("w2_packed", w2_packed), ("w2_scale", w2_scale)):
        _tensor(name, t, (torch.uint8,), 3)
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    _tensor("topk_weights", topk_weights, _FLOATS, 2)
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), 2)
    m, h = x.shape
    if h % 32:
        raise ValueError(f"x: hidden size {h} must be a multiple of 32 (the MXFP4 scale block)")
    e, two_i, half_k1 = w13_packed.shape
    k1 = 2 * half_k1
    if not h <= k1 < h + 256 or k1 % 32:
        raise ValueError(f"w13_packed must be [E, 2I, H/2] with H/2 = {h // 2} (or zero-padded along K by "
                         f"under 256 to a multiple of 32), got {tuple(w13_packed.shape)}")
    if two_i % 2 or (two_i // 2) % 32:
        raise ValueError(f"w13_packed: 2I = {two_i} must be twice a multiple of 32")
    inter = two_i // 2
    if tuple(w13_scale.shape) != (e, two_i, k1 // 32):
        raise ValueError(f"w13_scale must be [{e}, {two_i}, {k1 // 32}] to match w13_packed, "
                         f"got {tuple(w13_scale.shape)}")
    k2 = 2 * w2_packed.shape[2]
    if w2_packed.shape[:2] != (e, h) or not inter <= k2 < inter + 256 or k2 % 32:
        raise ValueError(f"w2_packed must be [{e}, {h}, {inter // 2}] (or zero-padded along K by under 256 "
                         f"to a multiple of 32), got {tuple(w2_packed.shape)}")
    if tuple(w2_scale.shape) != (e, h, k2 // 32):
        raise ValueError(f"w2_scale must be [{e}, {h}, {k2 // 32}] to match w2_packed, "
                         f"got {tuple(w2_scale.shape)}")
    if topk_ids.shape[0] != m or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [{m}, top_k], got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must match topk_ids {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale), ("w2_packed", w2_packed),
                    ("w2_scale", w2_scale), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: all inputs must share a device")
    return e, inter, k1, k2



def check_biases(w13_bias: Any, w2_bias: Any, experts: int, inter: int, hidden: int,
                 device: torch.device) -> None:
    """The optional expert biases: ``w13_bias [E, 2I]`` (gate columns, then up columns, as ``w13_packed``'s
    rows) and ``w2_bias [E, H]``, each None or a float tensor on ``x``'s device. They are per output column,
    so zero padding of the weights along K leaves their shapes alone."""
    for name, b, cols, what in (("w13_bias", w13_bias, 2 * inter, "2I"), ("w2_bias", w2_bias, hidden, "H")):
        if b is None:
            continue
        _tensor(name, b, _FLOATS, 2)
        if tuple(b.shape) != (experts, cols):
            raise ValueError(f"{name} must be [E, {what}] = [{experts}, {cols}], got {tuple(b.shape)}")
        if b.device != device:
            raise ValueError(f"{name} is on {b.device}, x on {device}: all inputs must share a device")


def check_scale_max(w13_scale_max: Any, w2_scale_max: Any, w13_scale: torch.Tensor,
                    w2_scale: torch.Tensor) -> None:
    """The optional stored row maxima (``moetune.quant.scale_row_max``): each None or uint8 ``[E, N]``, the
    scale's first two dimensions, contiguous along N, on the scale's device. Their values are checked only
    with ``validate=True`` (``layer``: a host sync)."""
    for name, t, scale in (("w13_scale_max", w13_scale_max, w13_scale), ("w2_scale_max", w2_scale_max,
                                                                          w2_scale)):
        if t is None:
            continue
        _tensor(name, t, (torch.uint8,), 2)
        if tuple(t.shape) != tuple(scale.shape[:2]) or t.stride(1) != 1:
            raise ValueError(f"{name} must be a contiguous [E, N] = {list(scale.shape[:2])} (the scale's row "
                             f"maxima, moetune.quant.scale_row_max), got shape {tuple(t.shape)}, strides "
                             f"{t.stride()}")
        if t.device != scale.device:
            raise ValueError(f"{name} is on {t.device}, the scales on {scale.device}: all inputs must "
                             f"share a device")
