"""A_FP8 2's activation split: each row's 128-K chunks as two e4m3 terms and one fp32 scale.

``split_fp8_rows`` runs it as a launch of its own; the gated activation (``epilogue``) writes the same
terms, to the bit, for the down GEMM's input. ``round_e4m3`` is shared with the in-kernel split of
A_FP8 1 (``tiles.block_tile``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from moetune.kernels.fp8_decode.config import SCALE_BLOCK
from moetune.kernels.fp8_decode.pdl import pdl_args, pdl_enter
from moetune.quant.fp8_block import FP8_DTYPE


@triton.jit
def round_e4m3(v):
    """fp32 ``v`` rounded (half away from zero) to e4m3's 3 mantissa bits by integer ops, so the fp8 cast
    after it is exact: the Triton interpreter's own fp32 -> e4m3 cast drops the carry of a rounding into
    the next binade (126.4 -> 64)."""
    bits = v.to(tl.int32, bitcast=True)
    return ((bits + 0x80000) & -0x100000).to(tl.float32, bitcast=True)


@triton.jit
def _split_rows_kernel(
    a_ptr, hi_ptr, lo_ptr, sa_ptr, K, CHUNKS_TOTAL, stride_am, stride_ak, stride_hm, stride_hk,
    stride_sam, stride_sac, CHUNKS: tl.constexpr, PDL: tl.constexpr,
):
    """A_FP8 2's activation split, once per GEMM: program (row, chunk group) writes CHUNKS 128-K chunks of
    row ``a[row]`` as hi = fp8(q), lo = fp8(8 (q - hi)), q = a / sa, sa = amax / 448 (A_FP8 1's terms, to
    the bit); hi and lo share strides. Elements past K are not written; a chunk's scale covers its part
    below K."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.program_id(1) * CHUNKS + tl.arange(0, CHUNKS)
    offs_k = chunks[:, None] * 128 + tl.arange(0, 128)[None, :]
    mask = offs_k < K
    a = tl.load(a_ptr + row * stride_am + offs_k * stride_ak, mask=mask, other=0.0).to(tl.float32)
    sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-30) * (1.0 / 448.0)
    q = a / sa[:, None]
    hi_f = round_e4m3(q)
    term = row * stride_hm + offs_k * stride_hk
    tl.store(hi_ptr + term, hi_f.to(tl.float8e4nv), mask=mask)
    tl.store(lo_ptr + term, round_e4m3((q - hi_f) * 8.0).to(tl.float8e4nv), mask=mask)
    tl.store(sa_ptr + row * stride_sam + chunks * stride_sac, sa, mask=chunks < CHUNKS_TOTAL)


SplitRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(hi [rows, K] e4m3, lo [rows, K] e4m3, sa [rows, >= ceil(K / 128)] fp32): a ~= (hi + lo / 8) * sa."""
_SPLIT_CHUNKS = 8  # 128-K chunks per split program (1024 elements)


def check_split(split: Any, rows: int, k: int, device: torch.device, name: str) -> SplitRows:
    """``split`` as (hi, lo, sa) for ``rows`` rows of length ``k``; ValueError naming ``name`` otherwise."""
    if not (isinstance(split, (tuple, list)) and len(split) == 3
            and all(isinstance(t, torch.Tensor) for t in split)):
        raise ValueError(f"{name} must be a tuple (hi, lo, sa) of 3 tensors, got {type(split).__name__}")
    hi, lo, sa = split
    chunks = triton.cdiv(k, SCALE_BLOCK)
    for term, t in (("hi", hi), ("lo", lo)):
        if t.dtype != FP8_DTYPE or tuple(t.shape) != (rows, k):
            raise ValueError(f"{name}: {term} must be {FP8_DTYPE} [{rows}, {k}], got {t.dtype} "
                             f"{tuple(t.shape)}")
    if lo.stride() != hi.stride():
        raise ValueError(f"{name}: lo must have hi's strides {hi.stride()}, got {lo.stride()}")
    if sa.dtype != torch.float32 or sa.dim() != 2 or sa.shape[0] != rows or sa.shape[1] < chunks:
        raise ValueError(f"{name}: sa must be float32 [{rows}, >= {chunks}] (one scale per row per 128-K "
                         f"chunk), got {sa.dtype} {tuple(sa.shape)}")
    for term, t in (("hi", hi), ("lo", lo), ("sa", sa)):
        if t.device != device:
            raise ValueError(f"{name}: {term} is on {t.device}, expected {device}")
    return hi, lo, sa


def split_fp8_rows(a: torch.Tensor, out: SplitRows | None = None, *, pdl: bool = False) -> SplitRows:
    """A_FP8 2's activation split of ``a [rows, K]`` (any strides; bf16, fp16 or fp32): per row and 128-K
    chunk, sa = max(amax, 1e-30) / 448, q = a / sa, hi = fp8(q), lo = fp8(8 (q - hi)), so that
    a ~= (hi + lo / 8) * sa within ~1e-3. Returns (hi [rows, K] e4m3, lo [rows, K] e4m3,
    sa [rows, ceil(K / 128)] fp32), written into ``out`` when given (checked like that)."""
    if a.dim() != 2:
        raise ValueError(f"a must have rank 2, got shape {tuple(a.shape)}")
    rows, k = a.shape
    chunks = triton.cdiv(k, SCALE_BLOCK)
    if out is None:
        out = (torch.empty(rows, k, dtype=FP8_DTYPE, device=a.device),
               torch.empty(rows, k, dtype=FP8_DTYPE, device=a.device),
               torch.empty(rows, chunks, dtype=torch.float32, device=a.device))
    hi, lo, sa = check_split(out, rows, k, a.device, "out")
    if rows and k:
        group = min(_SPLIT_CHUNKS, triton.next_power_of_2(chunks))
        _split_rows_kernel[(rows, triton.cdiv(chunks, group))](
            a, hi, lo, sa, k, chunks, a.stride(0), a.stride(1), hi.stride(0), hi.stride(1), sa.stride(0),
            sa.stride(1), CHUNKS=group, num_warps=4, **pdl_args(pdl))
    return hi, lo, sa
