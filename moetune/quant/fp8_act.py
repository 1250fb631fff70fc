"""Per-token, per-group FP8 (e4m3) activation quantization with power-of-two scales (W4A8 numerics)."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(max(amax, 1e-4) / 448))`` computed exactly (frexp, no log rounding)."""
    mant, expo = torch.frexp(amax.float().clamp_min(1e-4) / E4M3_MAX)
    e = torch.where(mant == 0.5, expo - 1, expo)
    return torch.exp2(e.float())


K_ORDERS = ("real", "wgmma")


def to_wgmma_k_order(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``t [rows, K]`` (K % 128 == 0) copied in the K order of the Gluon fp4 GEMM (``IMPL: "gluon"``):
    inside each 128-K chunk, position ``32b + 16h + 4q + i`` holds real ``32q + 8b + 4h + i``, so that lane
    group q of the wgmma fragment holds the whole 32-K scale group q. Into ``out`` (cast to its dtype)."""
    rows, k = t.shape
    if k % 128:
        raise ValueError(f"the wgmma K order permutes within 128-K chunks: K must be a multiple of 128, "
                         f"got {k}")
    if out is None:
        out = torch.empty(rows, k, dtype=t.dtype, device=t.device)
    real = t.reshape(rows, k // 128, 4, 4, 2, 4)  # [row, chunk, q, b, h, i]
    out.view(rows, k // 128, 4, 2, 4, 4).copy_(real.permute(0, 1, 3, 4, 2, 5))
    return out


def quantize_fp8_act(x: torch.Tensor, group: int = 128, *,
                     k_order: str = "real") -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(q float8_e4m3fn [M, K], scales fp32 [M, ceil(K/group)])``, ``x ~= q * scale``.

    ``k_order="wgmma"`` writes ``q`` in the Gluon GEMM's K order (:func:`to_wgmma_k_order`, group 128) in the
    same cast; the scales keep theirs."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2:
        raise ValueError(f"x must be a 2-D floating-point tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if group < 1:
        raise ValueError(f"group must be positive, got {group}")
    if k_order not in K_ORDERS:
        raise ValueError(f"k_order must be one of {K_ORDERS}, got {k_order!r}")
    if k_order == "wgmma" and group != 128:
        raise ValueError(f"k_order 'wgmma' permutes within the 128-K scale groups: group must be 128, "
                         f"got {group}")
    m, k = x.shape
    g = -(-k // group)
    xf = x.float()
    padded = torch.nn.functional.pad(xf, (0, g * group - k)).reshape(m, g, group)
    scales = pow2_scale(padded.abs().amax(dim=-1))
    q = (padded / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).reshape(m, g * group)[:, :k]
    if k_order == "wgmma":
        out = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
        return to_wgmma_k_order(q, out), scales.contiguous()
    return q.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()


def dequantize_fp8_act(q: torch.Tensor, scales: torch.Tensor, group: int = 128) -> torch.Tensor:
    """fp32 ``q * scale`` broadcast over each group."""
    k = q.shape[-1]
    return q.float() * scales.repeat_interleave(group, dim=-1)[..., :k]
