"""Per-token, per-group FP8 (e4m3) activation quantization with power-of-two scales (W4A8 numerics)."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(max(amax, 1e-4) / 448))`` computed exactly (frexp, no log rounding)."""
    mant, expo = torch.frexp(amax.float().clamp_min(1e-4) / E4M3_MAX)
    e = torch.where(mant == 0.5, expo - 1, expo)
    return torch.exp2(e.float())


def quantize_fp8_act(x: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(q float8_e4m3fn [M, K], scales fp32 [M, ceil(K/group)])``, ``x ~= q * scale``."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2:
        raise ValueError(f"x must be a 2-D floating-point tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if group < 1:
        raise ValueError(f"group must be positive, got {group}")
    m, k = x.shape
    g = -(-k // group)
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, g * group - k)).reshape(m, g, group)
    scales = pow2_scale(padded.abs().amax(dim=-1))
    q = (padded / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).reshape(m, g * group)[:, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()


def dequantize_fp8_act(q: torch.Tensor, scales: torch.Tensor, group: int = 128) -> torch.Tensor:
    """fp32 ``q * scale`` broadcast over each group."""
    k = q.shape[-1]
    return q.float() * scales.repeat_interleave(group, dim=-1)[..., :k]
