"""MXFP4 (ds_fp4) weights: E2M1 codes, two per byte, with a UE8M0 exponent per 32 values.

``W[n, k] = e2m1(code[n, k]) * 2^(scale[n, k // 32] - 127)``. E2M1 code bits are
sign (3), exponent (2..1), mantissa (0); magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
The low nibble of each byte holds the even k. Scale code 255 (NaN in the OCP MX
spec) is never produced.
"""

from __future__ import annotations

import torch

BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` float -> ``(packed [..., N, K/2] uint8, scale [..., N, K/32] uint8)``.

    Each 32-block gets the smallest power of two that lets its largest magnitude
    fit under 6; values round to the nearest E2M1 magnitude (ties to the even
    code, as hardware converters do) and saturate at 6.
    """
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"w must be a floating-point tensor, got {getattr(w, 'dtype', type(w).__name__)}")
    if w.dim() < 2 or w.shape[-1] % BLOCK:
        raise ValueError(f"w must be [..., N, K] with K a multiple of {BLOCK}, got {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("w has NaN or infinite values")
    *lead, n, k = w.shape
    blocks = w.float().reshape(*lead, n, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    # Exact ceil(log2(amax / 6)) through frexp: amax/6 = m * 2^e with m in [0.5, 1).
    mant, expo = torch.frexp(amax / 6.0)
    e = torch.where(mant == 0.5, expo - 1, expo)
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    scaled = blocks / torch.exp2(e.float()).unsqueeze(-1)
    mag = scaled.abs()
    mids = torch.tensor(_MIDPOINTS, device=w.device)
    down = torch.bucketize(mag, mids, right=False)  # ties round down
    up = torch.bucketize(mag, mids, right=True)  # ties round up
    code = torch.where(down % 2 == 0, down, up)  # differ only on ties: pick the even code
    code = code | ((scaled < 0) & (code > 0)).long() << 3
    code = code.reshape(*lead, n, k).to(torch.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8).contiguous()


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (any integer dtype) -> fp32 values."""
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    c = codes.long()
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def _packed_k(packed: torch.Tensor, scale: torch.Tensor) -> int:
    """K of a packed bank and its scales, or ValueError."""
    if packed.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise ValueError(f"packed and scale must be uint8, got {packed.dtype} and {scale.dtype}")
    k = packed.shape[-1] * 2
    if scale.shape[:-1] != packed.shape[:-1] or scale.shape[-1] * BLOCK != k:
        raise ValueError(f"scale {tuple(scale.shape)} does not match packed {tuple(packed.shape)}: "
                         f"expected [..., N, K/32] with K = {k}")
    return k


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_mxfp4`: fp32 ``[..., N, K]``, exact for scale codes 0..252."""
    k = _packed_k(packed, scale)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], k)
    vals = e2m1_decode(codes).reshape(*scale.shape, BLOCK)
    factor = torch.exp2(scale.float() - 127.0).unsqueeze(-1)
    return (vals * factor).reshape(*packed.shape[:-1], k)


def pad_mxfp4_k(packed: torch.Tensor, scale: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``packed [..., N, K/2]``, ``scale [..., N, K/32]`` zero-padded along K to ``k``: zero codes, under the
    row's own largest scale code, so the padding moves no row's maximum (the fp8 re-basing's reference,
    :func:`scale_row_max`). Done once when the weights load, it lets shapes whose K is not a multiple of 256
    run the Gluon kernels (gpt-oss-120b's 2880 -> 3072); ``fp4_prefill_moe`` pads the activations to match,
    so the padding adds zeros to every dot product."""
    old = _packed_k(packed, scale)
    if not isinstance(k, int) or k < old or k % BLOCK:
        raise ValueError(f"k must be a multiple of {BLOCK} and >= K ({old}), got {k!r}")
    packed = torch.nn.functional.pad(packed, (0, (k - old) // 2))
    row_max = scale.amax(dim=-1, keepdim=True) if old else torch.full_like(scale[..., :1], 127)
    scale = torch.cat([scale, row_max.expand(*scale.shape[:-1], (k - old) // BLOCK)], dim=-1)
    return packed.contiguous(), scale.contiguous()


def scale_row_max(scale: torch.Tensor) -> torch.Tensor:
    """Each weight row's largest UE8M0 scale code: ``[..., N]`` uint8 from ``scale [..., N, K/32]``. Made once
    when the weights load (after any :func:`pad_mxfp4_k`) and given to ``fp4_prefill_moe``
    (``w13_scale_max``, ``w2_scale_max``), it saves the Gluon kernels a pass over each tile's scales for the
    fp8 re-basing: 2-9% of a GEMM on the H200 (docs/kernels/fp4_prefill.md, row maxima)."""
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.uint8 or scale.dim() < 2:
        what = (f"{scale.dtype} {tuple(scale.shape)}" if isinstance(scale, torch.Tensor)
                else type(scale).__name__)
        raise ValueError(f"scale must be a uint8 tensor [..., N, K/32], got {what}")
    if scale.shape[-1] == 0:
        raise ValueError("scale has no scale groups (K = 0): a row has no largest code")
    return scale.amax(dim=-1).contiguous()
