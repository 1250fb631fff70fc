"""Gated activations between the two expert GEMMs, as pure-torch definitions.

These pin the semantics; the Triton kernels implement the same formulas and
the references call these. `gate` and `up` are the two halves of the gate/up
GEMM's output (gate rows first).
"""

from __future__ import annotations

from typing import Any

import torch

ACTIVATIONS = ("silu", "gelu_tanh", "swiglu")
SWIGLU_ALPHA = 1.702  # gpt-oss


def gated_activation(gate: torch.Tensor, up: torch.Tensor, activation: str,
                     limit: float | None = None) -> torch.Tensor:
    """fp32 math; returns fp32.

    - ``silu``: silu(gate) * up; with ``limit``, gate is clamped above and up to
      [-limit, limit] first (DeepSeek's swiglu_limit).
    - ``gelu_tanh``: gelu(gate, tanh approximation) * up.
    - ``swiglu``: gpt-oss style, gate * sigmoid(1.702 * gate) * (up + 1), with the
      same optional clamps.
    """
    g, u = gate.float(), up.float()
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if limit is not None and activation != "gelu_tanh":
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    if activation == "silu":
        return torch.nn.functional.silu(g) * u
    if activation == "gelu_tanh":
        return torch.nn.functional.gelu(g, approximate="tanh") * u
    return g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1.0)


def check_activation(activation: Any, swiglu_limit: Any) -> None:
    """ValueError for an activation not in :data:`ACTIVATIONS` or a limit that is not None or a positive
    finite number; both kernel paths check their arguments here."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if swiglu_limit is not None and not (isinstance(swiglu_limit, (int, float))
                                         and 0 < swiglu_limit < float("inf")):
        raise ValueError(f"swiglu_limit must be None or a positive finite number, got {swiglu_limit!r}")
