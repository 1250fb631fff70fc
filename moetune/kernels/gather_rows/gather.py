"""Gather quantized activation rows and their fp32 group scales in one launch.

An MoE layer quantizes its activation once per token, then replicates each row
once per expert the token routes to, so the grouped GEMM reads contiguous rows.
The scales are 1/32 of the bytes; gathering them in a launch of their own is
almost pure latency at decode sizes. Here one program copies a
``ROWS_PER_PROGRAM x BLOCK_SIZE_K`` tile of bytes, and the programs owning
column 0 also copy their rows' scales. Values are moved as raw bytes (never
decoded), so any 1-byte dtype works and the result is bit-exact.

Index contract: every ``dst2src`` entry must lie in ``[0, M)``. It is not checked
on the device (that would need a host sync); ``validate=True`` checks it up
front, and an out-of-range index otherwise reads arbitrary memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from moetune.device import interpreter_active
from moetune.kernels.gather_rows.config import MAX_K_TILES, check_config, group_count, shape


@triton.jit(do_not_specialize=["R"])
def _gather_rows_kernel(
    q_ptr, s_ptr, idx_ptr, qo_ptr, so_ptr,
    R, K, G, stride_idx,
    stride_qm, stride_qk, stride_sm, stride_sg,
    stride_om, stride_ok, stride_osm, stride_osg,
    BLOCK_SIZE_K: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_G: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = rows < R
    # int64 offsets: rows * K overflows int32 at shapes this serves.
    src = tl.load(idx_ptr + rows * stride_idx, mask=row_ok, other=0).to(tl.int64)
    dst = rows.to(tl.int64)
    cols = pid_k * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    mask = row_ok[:, None] & (cols < K)[None, :]
    cols = cols.to(tl.int64)
    vals = tl.load(q_ptr + src[:, None] * stride_qm + cols[None, :] * stride_qk, mask=mask)
    tl.store(qo_ptr + dst[:, None] * stride_om + cols[None, :] * stride_ok, vals, mask=mask)
    if pid_k == 0:
        grp = tl.arange(0, BLOCK_G)
        smask = row_ok[:, None] & (grp < G)[None, :]
        sc = tl.load(s_ptr + src[:, None] * stride_sm + grp[None, :] * stride_sg, mask=smask)
        tl.store(so_ptr + dst[:, None] * stride_osm + grp[None, :] * stride_osg, sc, mask=smask)


def gather_rows_with_scales_reference(
    q: torch.Tensor, scales: torch.Tensor, dst2src: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q[dst2src], scales[dst2src])`` by plain torch indexing, on byte views (fp8 safe)."""
    idx = dst2src.long()
    return q.view(torch.uint8)[idx].view(q.dtype), scales[idx]


def _check_inputs(q: Any, scales: Any, dst2src: Any) -> None:
    for name, t in (("q", q), ("scales", scales), ("dst2src", dst2src)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 2 or q.element_size() != 1:
        raise ValueError(f"q must be a 2-D tensor of a 1-byte dtype (float8, int8, uint8), "
                         f"got {q.dtype} with shape {tuple(q.shape)}")
    m, k = q.shape
    if scales.dtype != torch.float32:
        raise ValueError(f"scales must be float32, got {scales.dtype}")
    if tuple(scales.shape) != (m, group_count(k)):
        raise ValueError(f"scales must have shape [M, ceil(K/128)] = {[m, group_count(k)]} for q of shape "
                         f"{list(q.shape)}, got {list(scales.shape)}")
    if dst2src.dtype not in (torch.int32, torch.int64) or dst2src.dim() != 1:
        raise ValueError(f"dst2src must be a 1-D int32 or int64 tensor, got {dst2src.dtype} "
                         f"with shape {tuple(dst2src.shape)}")
    for name, t in (("scales", scales), ("dst2src", dst2src)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if q.device.type != "cuda" and not interpreter_active():
        raise ValueError(f"q is on {q.device}: the kernel needs a CUDA tensor "
                         f"(or TRITON_INTERPRET=1 for the CPU interpreter)")


def _check_out(out: Any, q: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, Sequence) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise ValueError("out must be a pair of tensors (q_out, s_out)")
    q_out, s_out = out
    k = q.shape[1]
    for name, t, dtype, want in (("q_out", q_out, q.dtype, (rows, k)),
                                 ("s_out", s_out, torch.float32, (rows, group_count(k)))):
        if t.dtype != dtype or tuple(t.shape) != want:
            raise ValueError(f"out: {name} must be {dtype} with shape {list(want)}, "
                             f"got {t.dtype} with shape {list(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"out: {name} is on {t.device} but q is on {q.device}")
    return q_out, s_out


def gather_rows_with_scales(
    q: torch.Tensor,
    scales: torch.Tensor,
    dst2src: torch.Tensor,
    *,
    config: Mapping[str, Any] | None = None,
    out: Sequence[torch.Tensor] | None = None,
    validate: bool = False,
    experts: int = 1,
    top_k: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q[dst2src], scales[dst2src])`` in one launch, bit-exact.

    Args:
        q: ``[M, K]`` quantized rows, any 1-byte dtype; any strides.
        scales: ``[M, ceil(K/128)]`` float32 group scales.
        dst2src: ``[R]`` int32/int64 (any stride) source row of each output row; entries must lie in
            ``[0, M)`` (the caller's contract, see the module docstring).
        config: ``BLOCK_SIZE_K``, ``ROWS_PER_PROGRAM``, ``num_warps``; None asks the tile
            picker (tuned table, else the spec's heuristic).
        out: optional preallocated ``(q_out [R, K] q.dtype, s_out [R, G] float32)``, written
            in place and returned; with it the call allocates nothing and never syncs the host,
            so it can be captured in a CUDA graph.
        validate: check the indices first (costs a host sync).
        experts, top_k: the layer's experts per rank and top-k, only to look up a tuned table
            (keyed by rows per expert); they do not change the result.
    """
    _check_inputs(q, scales, dst2src)
    m, k = q.shape
    rows = dst2src.numel()
    g = group_count(k)
    if out is None:
        q_out = torch.empty((rows, k), dtype=q.dtype, device=q.device)
        s_out = torch.empty((rows, g), dtype=torch.float32, device=q.device)
    else:
        q_out, s_out = _check_out(out, q, rows)
    if validate and rows and (m == 0 or int(dst2src.min()) < 0 or int(dst2src.max()) >= m):
        raise ValueError(f"dst2src has entries outside [0, {m}) (the rows of q)")
    if rows == 0 or k == 0:
        return q_out, s_out
    if config is None:
        from moetune.tables.picker import pick_config

        config = pick_config("gather_rows", shape(experts, k, top_k), rows)
    cfg = check_config(config)
    bk, rpp = cfg["BLOCK_SIZE_K"], cfg["ROWS_PER_PROGRAM"]
    k_tiles = triton.cdiv(k, bk)
    if k_tiles > MAX_K_TILES:
        raise ValueError(f"config BLOCK_SIZE_K {bk} gives {k_tiles} K tiles for K={k}; at most {MAX_K_TILES}")
    qb, qob = q.view(torch.uint8), q_out.view(torch.uint8)
    # Scales travel as int32 bit patterns, so NaN payloads survive too.
    sb, sob = scales.view(torch.int32), s_out.view(torch.int32)
    grid = (triton.cdiv(rows, rpp), k_tiles)
    _gather_rows_kernel[grid](
        qb, sb, dst2src, qob, sob,
        rows, k, g, dst2src.stride(0),
        qb.stride(0), qb.stride(1), sb.stride(0), sb.stride(1),
        qob.stride(0), qob.stride(1), sob.stride(0), sob.stride(1),
        BLOCK_SIZE_K=bk, ROWS_PER_PROGRAM=rpp, BLOCK_G=triton.next_power_of_2(g),
        num_warps=cfg["num_warps"],
    )
    return q_out, s_out
