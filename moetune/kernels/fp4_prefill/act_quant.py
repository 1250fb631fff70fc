"""The FP8 activation quantizers of the FP4 prefill path: the input's (``act_quant``) and, fused, the step
between the GEMMs: gated activation, routing weight, FP8 quantization (``swiglu_quant``).

One program per (row, group): for ``swiglu_quant`` ``h = act(gate, up) * weight`` in fp32, ``act`` one of
:data:`moetune.kernels.activations.ACTIVATIONS` with its optional clamp (silu: ``silu(min(gate, limit)) *
clamp(up, -limit, limit)``), gate and up first given the row's expert's optional bias; for ``act_quant`` the
input row; then ``q = h / scale`` in e4m3 with the power-of-two ``scale = 2^ceil(log2(max(amax, 1e-4) /
448))`` (the numerics of ``quantize_fp8_act``, the exponent taken from the fp32 bits so no log is rounded).
Inactive routes return before reading anything; their rows are never read by the down GEMM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moetune.device import interpreter_active
from moetune.kernels.activations import ACTIVATIONS

_ACT_CODE = {name: i for i, name in enumerate(ACTIVATIONS)}  # the kernel's ACTIVATION


@triton.jit
def _round_to_e4m3(v):
    """Round fp32 to the nearest e4m3 value (ties to even) in fp32 arithmetic.

    Only for the CPU interpreter, whose fp32 -> e4m3 cast (Triton 3.9) drops the carry when
    rounding up crosses a power of two (126.3 -> 64); the GPU converts in hardware.
    """
    bits = v.to(tl.int32, bitcast=True)
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # keep 3 mantissa bits
    sub = (tl.abs(v) * 512.0 + 12582912.0) - 12582912.0  # multiples of 2^-9 below e4m3's normal range
    sub = tl.where(bits < 0, -sub, sub) / 512.0  # the sign bit, so -0 stays -0
    return tl.where(tl.abs(v) >= 0.015625, normal.to(tl.float32, bitcast=True), sub)


@triton.jit
def _quant_group_store(h, offs, ok, g, q_row, s_row, GROUP: tl.constexpr, ROUND_FIRST: tl.constexpr,
                       WGMMA_ORDER: tl.constexpr):
    """Quantize one fp32 group ``h`` (masked lanes 0) to e4m3 with its power-of-two scale; store both."""
    amax = tl.maximum(tl.max(tl.abs(h), axis=0), 1e-4) / 448.0
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # exponent field of the scale
    scale = (e << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 1 / scale, exact
    v = tl.minimum(tl.maximum(h * inv, -448.0), 448.0)
    if ROUND_FIRST:
        v = _round_to_e4m3(v)
    q = v.to(tl.float8e4nv)
    dst = offs
    if WGMMA_ORDER:  # real 32q + 8b + 4h + i of the group at 32b + 16h + 4q + i (to_wgmma_k_order)
        j = tl.arange(0, GROUP)
        dst = g * GROUP + ((j >> 3) & 3) * 32 + ((j >> 2) & 1) * 16 + (j >> 5) * 4 + (j & 3)
    tl.store(q_row + dst, q, mask=ok)
    tl.store(s_row + g, scale)


@triton.jit
def _swiglu_quant_kernel(gu_ptr, w_ptr, ids_ptr, b_ptr, q_ptr, s_ptr, inter, width, limit, experts,
                         stride_gu, stride_be, stride_bn, stride_q, stride_s, HAS_LIMIT: tl.constexpr,
                         HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, ROUND_FIRST: tl.constexpr,
                         WGMMA_ORDER: tl.constexpr, ACTIVATION: tl.constexpr):
    """ACTIVATION: 0 silu, 1 gelu_tanh, 2 swiglu, formulas and clamps as moetune.kernels.activations.
    HAS_BIAS: the row's expert's gate/up bias ``b [E, 2I]`` is added before the clamp."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    e = tl.load(ids_ptr + r)
    if e < 0:
        return
    offs = g * GROUP + tl.arange(0, GROUP)
    ok = offs < inter
    gate = tl.load(gu_ptr + r * stride_gu + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + r * stride_gu + inter + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:  # an id past the experts (undefined, caught by validate=True) reads no bias
        b_row = b_ptr + e.to(tl.int64) * stride_be
        b_ok = ok & (offs * 0 + e < experts)  # a block: the interpreter refuses scalar masks
        gate += tl.load(b_row + offs * stride_bn, mask=b_ok, other=0.0).to(tl.float32)
        up += tl.load(b_row + (inter + offs) * stride_bn, mask=b_ok, other=0.0).to(tl.float32)
    if HAS_LIMIT and ACTIVATION != 1:  # gelu_tanh takes no clamp
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    # every activation is 0 past inter (gate = up = 0), so the group's amax is the real columns'
    if ACTIVATION == 0:
        h = gate / (1.0 + tl.exp(-gate)) * up * tl.load(w_ptr + r)
    else:
        if ACTIVATION == 1:  # 0.5 (1 + tanh(z)) == sigmoid(2 z), z = sqrt(2 / pi) (gate + 0.044715 gate^3)
            act = gate * tl.sigmoid(1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)) * up
        else:  # alpha = moetune.kernels.activations.SWIGLU_ALPHA
            act = gate * tl.sigmoid(1.702 * gate) * (up + 1.0)
        h = act * tl.load(w_ptr + r)
    _quant_group_store(h, offs, offs < width, g, q_ptr + r * stride_q, s_ptr + r * stride_s, GROUP,
                       ROUND_FIRST, WGMMA_ORDER)


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, k, width, stride_xm, stride_xk, stride_q, stride_s,
                      GROUP: tl.constexpr, ROUND_FIRST: tl.constexpr, WGMMA_ORDER: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    offs = g * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + r * stride_xm + offs.to(tl.int64) * stride_xk, mask=offs < k, other=0.0)
    _quant_group_store(x.to(tl.float32), offs, offs < width, g, q_ptr + r * stride_q, s_ptr + r * stride_s,
                       GROUP, ROUND_FIRST, WGMMA_ORDER)


def _outputs(rows: int, k: int, width: int | None, group: int, k_order: str, what: str,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """A quantizer's checked arguments and its outputs: (q, scales, width, groups)."""
    if width is None:
        width = k
    if not isinstance(width, int) or width < k:
        raise ValueError(f"width must be an int >= the {what} ({k}), got {width!r}")
    if k_order not in ("real", "wgmma"):
        raise ValueError(f"k_order must be 'real' or 'wgmma', got {k_order!r}")
    if k_order == "wgmma" and (group != 128 or width % 128):
        raise ValueError(f"k_order 'wgmma' permutes within 128-wide groups: needs group 128 and the "
                         f"width a multiple of 128, got group {group}, width {width}")
    groups = triton.cdiv(width, group)
    q = torch.empty(rows, width, dtype=torch.float8_e4m3fn, device=device)
    return q, torch.empty(rows, groups, dtype=torch.float32, device=device), width, groups


def act_quant(x: torch.Tensor, group: int = 128, *, k_order: str = "real",
              width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moetune.quant.quantize_fp8_act` in one launch, bit for bit: ``x [M, K]`` (any float dtype and
    strides) -> ``(q e4m3 [M, W], scales fp32 [M, ceil(W / group)])``; ``k_order="wgmma"`` stores ``q`` in
    the Gluon GEMM's K order. ``width`` W >= K (default K) pads with zeros, as for weights zero-padded along
    K (:func:`moetune.quant.pad_mxfp4_k`). The torch version makes several fp32 passes over ``x``; this reads
    it once."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2:
        raise ValueError(f"x must be a 2-D floating-point tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if group < 1 or group & (group - 1):
        raise ValueError(f"group must be a power of two, got {group}")
    m, k = x.shape
    q, s, width, groups = _outputs(m, k, width, group, k_order, "K", x.device)
    if m and width:
        _act_quant_kernel[(m, groups)](x, q, s, k, width, x.stride(0), x.stride(1), q.stride(0), s.stride(0),
                                       GROUP=group, ROUND_FIRST=interpreter_active(),
                                       WGMMA_ORDER=k_order == "wgmma")
    return q, s


def swiglu_quant(gate_up: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, limit: float | None,
                 group: int = 128, *, k_order: str = "real", width: int | None = None,
                 activation: str = "silu",
                 bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``gate_up [R, 2I]`` (fp32 or bf16, math in fp32) and ``weights``, ``ids`` ``[R]`` ->
    ``(q e4m3 [R, W], scales fp32 [R, ceil(W / group)])`` of ``gated_activation(gate, up, activation,
    limit) * weight``, W = ``width`` >= I (default I, zeros past I); rows of inactive routes are left
    unwritten. ``k_order="wgmma"`` stores ``q`` in the Gluon GEMM's K order (W % 128 == 0, group 128).
    ``bias [E, 2I]`` (optional, any float dtype): row ``r`` adds ``bias[ids[r]]`` to its gate and up columns
    before the clamp and the activation."""
    if activation not in _ACT_CODE:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    routes, two_i = gate_up.shape
    inter = two_i // 2
    if bias is not None and (bias.dim() != 2 or bias.shape[1] != two_i or not bias.is_floating_point()):
        raise ValueError(f"bias must be a float tensor [E, {two_i}] (2I of gate_up), got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    q, s, width, groups = _outputs(routes, inter, width, group, k_order, "intermediate", gate_up.device)
    if routes and width:
        _swiglu_quant_kernel[(routes, groups)](
            gate_up, weights, ids, bias, q, s, inter, width, 0.0 if limit is None else float(limit),
            0 if bias is None else bias.shape[0], gate_up.stride(0),
            *((0, 0) if bias is None else bias.stride()), q.stride(0), s.stride(0),
            HAS_LIMIT=limit is not None, HAS_BIAS=bias is not None, GROUP=group,
            ROUND_FIRST=interpreter_active(), WGMMA_ORDER=k_order == "wgmma",
            ACTIVATION=_ACT_CODE[activation],
        )
    return q, s
