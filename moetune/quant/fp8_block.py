"""128x128 block-scaled FP8 (e4m3) weights, the DeepSeek-V3 checkpoint format.

One fp32 scale per weight block, stored the checkpoints' ``weight_scale_inv`` way:
``w ≈ w_fp8 * scale`` (the scale multiplies, it is not divided by). N and K need not
be multiples of the block; the last block of a row or column is partial. Kernels
accept scale tensors whose last dim is padded beyond ``ceil(K / block_k)``.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def _check_block(block: tuple[int, int]) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(f"block must be a pair of positive ints (block_n, block_k), got {block!r}")
    return int(block[0]), int(block[1])


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int] = (128, 128)
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [.., N, K]`` float -> ``(w_fp8 [.., N, K] e4m3, scale [.., ceil(N/bn), ceil(K/bk)] fp32)``.

    Each block's absolute max maps to 448, the largest e4m3 value; all-zero blocks get scale 1.
    """
    bn, bk = _check_block(block)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() < 2:
        raise ValueError(f"w must be a floating-point tensor [.., N, K], got "
                         f"{getattr(w, 'dtype', type(w).__name__)} of shape {tuple(getattr(w, 'shape', ()))}")
    *lead, n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    wf = torch.zeros(*lead, nb * bn, kb * bk, dtype=torch.float32, device=w.device)
    wf[..., :n, :k] = w.float()
    blocks = wf.reshape(*lead, nb, bn, kb, bk)
    amax = blocks.abs().amax(dim=(-3, -1))  # [.., nb, kb]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    w_fp8 = q.reshape(*lead, nb * bn, kb * bk)[..., :n, :k].to(FP8_DTYPE).contiguous()
    return w_fp8, scale.contiguous()


def dequantize_fp8_block(w_fp8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (128, 128)
                         ) -> torch.Tensor:
    """fp32 ``w_fp8 * scale`` per block; ``scale`` may carry padding beyond the blocks ``w_fp8`` needs."""
    bn, bk = _check_block(block)
    if w_fp8.dim() < 2:
        raise ValueError(f"w_fp8 must be [.., N, K], got shape {tuple(w_fp8.shape)}")
    *lead, n, k = w_fp8.shape
    nb, kb = -(-n // bn), -(-k // bk)
    if (scale.dim() != w_fp8.dim() or tuple(scale.shape[:-2]) != tuple(lead)
            or scale.shape[-2] < nb or scale.shape[-1] < kb):
        raise ValueError(f"scale must be [{', '.join(map(str, lead + [nb, kb]))}] (padding allowed) "
                         f"for w_fp8 of shape {tuple(w_fp8.shape)}, got {tuple(scale.shape)}")
    s = scale[..., :nb, :kb].float()
    s = s.repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)[..., :n, :k]
    return w_fp8.float() * s
