"""The grouped GEMM of the FP4 prefill path: fp8 activations x MXFP4 expert weights, fp32 accumulation.

One program per (M-block, N-tile) of the expert-aligned routes (see ``align``);
programs past the padded count exit before reading anything. E2M1 codes are decoded
inside the K loop with integer ops and no lookup table; two switches pick how.

``UNPACK`` (how codes leave their bytes):

- ``join``: nibbles split with ``& 0xF`` / ``>> 4`` and interleaved by ``tl.join``; a code
  becomes the fp16 bits ``sign << 15 | magnitude << 9``, exactly ``e2m1 * 2^-14``
  (codes 0 and 1 land on fp16 subnormals).
- ``asm``: four packed bytes per 32-bit register become the e4m3 bytes
  ``sign << 7 | magnitude << 2`` of both nibbles (exactly ``e2m1 * 2^-6``) in a handful of
  PTX instructions. The CPU interpreter runs the same bit ops as Triton code instead.
- ``asm16``: four packed bytes become ``join``'s fp16 bits directly as f16x2 pairs (two
  ``prmt`` byte spreads, then shift/mask per pair: about 2.3 instructions per weight),
  skipping the int32 widening of ``join`` and the e4m3 -> fp16 conversion of ``asm``.
  The interpreter runs ``join``'s bit ops.
- ``halves``: the same f16x2 PTX, but the even-k and odd-k halves are never interleaved:
  the activation tile is split the same way (``tl.split`` of adjacent pairs) and each half
  is one dot of K = BLOCK_SIZE_K / 2 into the same accumulator, so no join/reshape
  shuffles of the decoded weights. Needs BLOCK_SIZE_K >= 64 (fp8 dots need K >= 32).
- ``lut`` (DECODE ``fp8``/``fp8_row`` only): each code becomes its final re-based e4m3 byte
  in a ``prmt`` table lookup: the 8 magnitudes times ``2^(1 - d)`` are one 8-byte pool per
  re-base distance d (made in registers once per row and 32-K group on the GPU; the
  interpreter reads ``e4m3_pools``), so a register of 4 packed bytes costs about
  10 integer instructions for its 8 weights, with no fp16 multiply and no fp16 -> e4m3
  conversion. Codes come out in groups of four (k0-3 and k4-7 of each register): with M tiles
  up to the N tile the activations are split the same way and each half is one dot of
  K = BLOCK_SIZE_K / 2; with larger M tiles the (smaller) weight tile is put back in k order.
  Bit-identical to ``halves`` with ``fp8`` on the GPU.

``SWAP_AB`` computes the transposed tile ``W @ A.T`` (BLOCK_SIZE_N x BLOCK_SIZE_M): the
decoded weights become the MMA's left operand, which sm_90's wgmma may take straight from
registers (no shared-memory hand-off of the decoded tile), and the token tile becomes
wgmma's N, which may be 16 or 32 where the weights-on-the-right form needs M >= 64 for
wgmma at all. The scale factors and the store follow the transposition.

``DECODE`` (how the UE8M0 scale per 32 is applied):

- ``fp8``: each K chunk's weights re-based on the row's largest scale in the chunk
  (``e2m1 * 2^(1 - d)``, d = smax - s, one fp16 multiply) and rounded to e4m3, one fp8
  tensor-core dot per chunk against the raw e4m3 activations, rescaled by
  ``x_scale[m] * 2^(smax[n] - 128)``. Exact while a chunk's scales differ by at most 9
  (beyond, values under 2^-9 of the chunk's largest round). Scale codes >= 2.
- ``fp8_row``: as ``fp8`` but re-based on the largest scale of the whole weight row (one
  extra pass over the row's scales), so each chunk's dot needs only the per-row activation
  scale and the weight factor is applied once after the K loop. Exact while a row's scales
  differ by at most 9; beyond, values under 2^-9 of the row's largest round.
- ``f16``: the same re-based weights kept in fp16 (exact while a chunk's scales differ by
  at most 23) against the activations widened to fp16: below 64-row M tiles sm_90 runs
  mma.sync, which has no fp8 form, so this skips the fp16 -> e4m3 -> fp16 round trip.
- ``fp8_scaled``: the e4m3 bytes of ``asm``/its Triton twin go to the tensor cores one
  32-wide K group at a time; each group's fp32 dot is scaled by ``2^(scale - 121)`` per
  column, each chunk by ``x_scale`` per row. Exact; scale codes <= 248.
- ``bf16``: weights widened to fp32, multiplied by their power-of-two scale and rounded
  to bf16 (exact); activations ``q * x_scale`` (exact in bf16); one bf16 dot per chunk.
  Scale codes <= 240.

All but ``bf16`` need BLOCK_SIZE_K <= 128 (one activation scale per chunk).

``SCALE_AHEAD`` loads each K chunk's weight and activation scales one step early, into registers
carried by the loop. Triton's pipeline stages copy only loads of 4 bytes or more a thread
asynchronously, and a chunk's scales are 1-2 bytes a thread, so without it every step waits a global
load's latency before it can decode.

``A_QUADS`` (``lut`` with M tiles up to the N tile): the activation tile's two halves are loaded as
they are used, columns k0-3 and k4-7 of every eight (4-byte runs, which the pipeline copies into
shared memory asynchronously), instead of loaded whole and split in registers, which sends them
through registers back to shared memory for the tensor cores every step.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from moetune.device import interpreter_active
from moetune.kernels.fp4_prefill.ptx import (
    E2M1_TO_E4M3_ASM,
    E2M1_TO_E4M3_LUT_ASM,
    E2M1_TO_F16_ASM,
    E4M3_POOL_ASM,
)

DECODES = {"bf16": 0, "fp8": 1, "fp8_scaled": 2, "f16": 3, "fp8_row": 4}
UNPACKS = {"join": 0, "asm": 1, "asm16": 2, "halves": 3, "lut": 4}
# Re-base distances d = smax - s beyond this give pools that round to zero (6 * 2^(1 - 14) < 2^-10).
LUT_MAX_D = tl.constexpr(15)
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@functools.cache
def e4m3_pools(device: torch.device) -> torch.Tensor:
    """UNPACK ``lut``'s tables: int32 [LUT_MAX_D + 1, 2], row d the 8 bytes of the e4m3 values (round
    to nearest even) of the E2M1 magnitudes times 2^(1 - d), little-endian: byte i = magnitude code i."""
    d = torch.arange(LUT_MAX_D.value + 1, dtype=torch.float32)[:, None]
    vals = torch.tensor(_E2M1_MAGNITUDES) * torch.exp2(1 - d)
    return vals.to(torch.float8_e4m3fn).view(torch.uint8).view(torch.int32).to(device)


@triton.jit
def _quads(x, ROWS: tl.constexpr, COLS: tl.constexpr):
    """[ROWS, COLS] -> (first, second) [ROWS, COLS // 2]: the first and last four of every eight columns,
    the halves ``lut``'s two dots run on."""
    x4 = tl.permute(tl.reshape(x, (ROWS, COLS // 8, 2, 4)), (0, 1, 3, 2))
    first, second = tl.split(x4)
    return tl.reshape(first, (ROWS, COLS // 2)), tl.reshape(second, (ROWS, COLS // 2))


@triton.jit
def _unquads(first, second, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The inverse of ``_quads``: two [ROWS, COLS // 2] halves back into one [ROWS, COLS] in k order."""
    q = tl.join(tl.reshape(first, (ROWS, COLS // 8, 4)), tl.reshape(second, (ROWS, COLS // 8, 4)))
    return tl.reshape(tl.permute(q, (0, 1, 3, 2)), (ROWS, COLS))


@triton.jit
def _lut_quads(packed, d, lut_ptr, ROWS: tl.constexpr, G: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 [ROWS, G * 16] packed codes and their re-base distance d [ROWS, G] (<= LUT_MAX_D) ->
    ``_quads`` of the float8e4nv weights [ROWS, G * 32] = e2m1 * 2^(1 - d), rounded to e4m3 as
    ``halves``' fp16 product is on the GPU. The GPU makes each (row, group)'s pool in registers (no
    memory round trip behind the scale load); the interpreter, whose fp16 -> e4m3 cast truncates
    subnormals, looks it up in ``lut_ptr`` (``e4m3_pools``). The PTX assumes each thread's packed
    bytes come in aligned runs of four along K (one register): so they do in the dot-operand layouts
    Triton gives these tiles, and the accuracy check of every candidate would catch one where not."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(E4M3_POOL_ASM, "=r,=r,r", [d], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)
    else:
        lo = tl.load(lut_ptr + 2 * d)
        hi = tl.load(lut_ptr + 2 * d + 1)
    lo_pool = tl.reshape(tl.broadcast_to(lo[:, :, None], (ROWS, G, 16)), (ROWS, G * 16))
    hi_pool = tl.reshape(tl.broadcast_to(hi[:, :, None], (ROWS, G, 16)), (ROWS, G * 16))
    if USE_ASM:
        first, second = tl.inline_asm_elementwise(E2M1_TO_E4M3_LUT_ASM, "=r,=r,r,r,r,r,r,r,r,r,r",
                                                  [packed, lo_pool, hi_pool], dtype=(tl.uint8, tl.uint8),
                                                  is_pure=True, pack=4)
    else:  # the same lookup one code at a time, then the same halves
        c = packed.to(tl.int32)
        m_lo = c & 7
        m_hi = (c >> 4) & 7
        w_lo = tl.where(m_lo < 4, lo_pool, hi_pool)
        w_hi = tl.where(m_hi < 4, lo_pool, hi_pool)
        lo = (((w_lo >> ((m_lo & 3) * 8)) & 0xFF) | ((c & 8) << 4)).to(tl.uint8)
        hi = (((w_hi >> ((m_hi & 3) * 8)) & 0xFF) | (c & 0x80)).to(tl.uint8)
        first, second = _quads(tl.reshape(tl.join(lo, hi), (ROWS, G * 32)), ROWS, G * 32)
    return first.to(tl.float8e4nv, bitcast=True), second.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _f16_codes(packed, ROWS: tl.constexpr, G: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 [ROWS, G * 16] packed codes -> float16 [ROWS, G, 32] = e2m1 * 2^-14 (exact), k order kept."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(E2M1_TO_F16_ASM, "=r,=r,=r,=r,r", [packed],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
        w16 = tl.reshape(tl.join(lo, hi), (ROWS, G, 32))
    else:
        codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (ROWS, G, 32)).to(tl.int32)
        w16 = (((codes & 7) << 9) | ((codes & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)
    return w16


@triton.jit
def _mm(x, w, acc, SWAP_AB: tl.constexpr):
    """x [BM, BK] against w [BN, BK] into acc: ``acc + x @ w.T``, or ``acc + w @ x.T`` with SWAP_AB."""
    if SWAP_AB:
        out = tl.dot(w, tl.trans(x), acc)
    else:
        out = tl.dot(x, tl.trans(w), acc)
    return out


@triton.jit
def _scaled(w16, fac, ROWS: tl.constexpr, G: tl.constexpr, W: tl.constexpr, DTYPE: tl.constexpr,
            F32: tl.constexpr):
    """fp16 weights [ROWS, G * W] times their factor per (row, 32-K group) [ROWS, G], rounded to DTYPE
    (in fp32 when F32: the bf16 decode's factors leave the fp16 range)."""
    w = tl.reshape(w16, (ROWS, G, W))
    if F32:
        w = w.to(tl.float32)
    return tl.reshape((w * fac[:, :, None]).to(DTYPE), (ROWS, G * W))


@triton.jit
def _f16_halves(packed, USE_ASM: tl.constexpr):
    """uint8 [ROWS, C] packed codes -> (even-k, odd-k) float16 [ROWS, C] = e2m1 * 2^-14, not interleaved."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(E2M1_TO_F16_ASM, "=r,=r,=r,=r,r", [packed],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        c = packed.to(tl.int16)
        lo = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.float16, bitcast=True)
        hi = (((c & 0x70) << 5) | ((c & 0x80) << 8)).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def _rows(v, SWAP_AB: tl.constexpr):
    """A per-M-row vector broadcast over the accumulator (M is its second axis with SWAP_AB)."""
    if SWAP_AB:
        out = v[None, :]
    else:
        out = v[:, None]
    return out


@triton.jit
def _cols(v, SWAP_AB: tl.constexpr):
    """A per-N-column vector broadcast over the accumulator."""
    if SWAP_AB:
        out = v[:, None]
    else:
        out = v[None, :]
    return out


@triton.jit
def _e4m3_raw(packed, ROWS: tl.constexpr, COLS: tl.constexpr, USE_ASM: tl.constexpr):
    """uint8 [ROWS, COLS // 2] packed codes -> float8e4nv [ROWS, COLS] holding e2m1 * 2^-6, k order kept."""
    if USE_ASM:
        lo, hi = tl.inline_asm_elementwise(E2M1_TO_E4M3_ASM, "=r,=r,r", [packed],
                                           dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        lo = ((packed << 2) & 0x1C) | ((packed << 4) & 0x80)
        hi = ((packed >> 2) & 0x1C) | (packed & 0x80)
    raw = tl.reshape(tl.join(lo, hi), (ROWS, COLS))
    return raw.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _chunk_scales(ws_rows, as_rows, n_ok, row_ok, k0, K, G: tl.constexpr):
    """The UE8M0 weight scales [BN, G] (int32; 127 past K) and the activation scales [BM] (0 past K) of
    the K chunk at k0."""
    offs_g = k0 // 32 + tl.arange(0, G)
    s = tl.load(ws_rows[:, None] + offs_g[None, :], mask=n_ok[:, None] & (offs_g < K // 32)[None, :],
                other=127).to(tl.int32)
    k_left = row_ok.to(tl.int32) * 0 + k0 < K  # a tensor: the interpreter takes no scalar mask term here
    xs = tl.load(as_rows + k0 // 128, mask=row_ok & k_left, other=0.0)
    return s, xs


# num_blocks moves with E and the routes (only compared); GROUP_SIZE_M only orders the programs: both
# are run-time values, never specialized, so every GROUP_SIZE_M of a tile runs one binary.
@triton.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_moe_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, lut_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    N, K, routes, num_blocks,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
    A_DIV: tl.constexpr, GATHERED: tl.constexpr, DECODE: tl.constexpr, UNPACK: tl.constexpr,
    USE_ASM: tl.constexpr, SWAP_AB: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M, EVEN_K: tl.constexpr, F32_DOT: tl.constexpr, W_TMA: tl.constexpr,
    SCALE_AHEAD: tl.constexpr, A_QUADS: tl.constexpr,
):
    G: tl.constexpr = BLOCK_SIZE_K // 32
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = tl.minimum(num_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    if pid_m * BLOCK_SIZE_M >= tl.load(num_padded_ptr):
        return

    offs_slot = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    route = tl.load(sorted_ids_ptr + offs_slot)
    row_ok = route < routes
    if GATHERED:
        a_row = offs_slot.to(tl.int64)
    else:
        a_row = tl.where(row_ok, route // A_DIV, 0).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    n_ok = offs_n < N
    if not W_TMA:  # else w_ptr is a descriptor of the packed weights [E, N, K / 2], [1, BN, BK / 2] tiles
        w_rows = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn
    ws_rows = w_scale_ptr + expert * stride_wse + offs_n * stride_wsn
    a_rows = a_ptr + a_row[:, None] * stride_am
    as_rows = a_scale_ptr + a_row * stride_asm

    if DECODE == 4:  # the largest scale of each weight row, over all of K
        rmax = tl.zeros((BLOCK_SIZE_N,), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_SIZE_K):
            offs_g = k0 // 32 + tl.arange(0, G)
            sr = tl.load(ws_rows[:, None] + offs_g[None, :], mask=n_ok[:, None] & (offs_g < K // 32)[None, :],
                         other=0)
            rmax = tl.maximum(rmax, tl.max(sr.to(tl.int32), axis=1))

    if SWAP_AB:
        acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if SCALE_AHEAD:
        s_next, xs_next = _chunk_scales(ws_rows, as_rows, n_ok, row_ok, 0, K, G)
    for k0 in range(0, K, BLOCK_SIZE_K):
        if DECODE == 2:
            xs = tl.load(as_rows + k0 // 128, mask=row_ok, other=0.0)
            chunk = tl.zeros_like(acc)
            for g in tl.static_range(G):
                kg = k0 + g * 32
                offs_k = kg + tl.arange(0, 32)
                offs_b = kg // 2 + tl.arange(0, 16)
                if EVEN_K:  # no K mask: lets the loads vectorize
                    a = tl.load(a_rows + offs_k[None, :], mask=row_ok[:, None], other=0.0)
                    packed = tl.load(w_rows + offs_b[None, :], mask=n_ok[:, None], other=0)
                    s = tl.load(ws_rows + kg // 32, mask=n_ok, other=0).to(tl.int32)
                else:
                    a = tl.load(a_rows + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :],
                                other=0.0)
                    packed = tl.load(w_rows + offs_b[None, :],
                                     mask=n_ok[:, None] & (offs_b < K // 2)[None, :], other=0)
                    s = tl.load(ws_rows + kg // 32, mask=n_ok & (offs_n * 0 + kg < K), other=0).to(tl.int32)
                b = _e4m3_raw(packed, BLOCK_SIZE_N, 32, USE_ASM)
                wf = ((s + 6) << 23).to(tl.float32, bitcast=True)  # 2^(s - 121)
                chunk += _mm(a, b, tl.zeros_like(acc), SWAP_AB) * _cols(wf, SWAP_AB)
            acc += chunk * _rows(xs, SWAP_AB)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_SIZE_K)
            offs_g = k0 // 32 + tl.arange(0, G)
            offs_b = k0 // 2 + tl.arange(0, BLOCK_SIZE_K // 2)
            if SCALE_AHEAD:  # this chunk's scales came with the last step; the next chunk's leave now
                s, xs = s_next, xs_next
                s_next, xs_next = _chunk_scales(ws_rows, as_rows, n_ok, row_ok, k0 + BLOCK_SIZE_K, K, G)
            if EVEN_K:
                k_ok = offs_k >= 0
                if not A_QUADS:
                    a = tl.load(a_rows + offs_k[None, :], mask=row_ok[:, None], other=0.0)
                if not SCALE_AHEAD:
                    s = tl.load(ws_rows[:, None] + offs_g[None, :], mask=n_ok[:, None],
                                other=127).to(tl.int32)
                if not W_TMA:
                    packed = tl.load(w_rows + offs_b[None, :], mask=n_ok[:, None], other=0)
            else:
                k_ok = offs_k < K
                if not A_QUADS:
                    a = tl.load(a_rows + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                if not SCALE_AHEAD:
                    s = tl.load(ws_rows[:, None] + offs_g[None, :],
                                mask=n_ok[:, None] & (offs_g < K // 32)[None, :], other=127).to(tl.int32)
                if not W_TMA:
                    packed = tl.load(w_rows + offs_b[None, :],
                                     mask=n_ok[:, None] & (offs_b < K // 2)[None, :], other=0)
            if W_TMA:  # one TMA copy; zeros past N and K (code 0 is +0)
                packed = w_ptr.load([expert.to(tl.int32), pid_n * BLOCK_SIZE_N, k0 // 2]).reshape(
                    BLOCK_SIZE_N, BLOCK_SIZE_K // 2)
            if UNPACK == 4:  # re-based e4m3 bytes straight from the table, two dots of K / 2
                if DECODE == 4:
                    smax = rmax
                else:
                    smax = tl.max(s, axis=1)
                b, b2 = _lut_quads(packed, tl.minimum(smax[:, None] - s, LUT_MAX_D), lut_ptr, BLOCK_SIZE_N, G,
                                   USE_ASM)
                if BLOCK_SIZE_M > BLOCK_SIZE_N:  # reorder the smaller tile: here the weights, one dot
                    part = _mm(a, _unquads(b, b2, BLOCK_SIZE_N, BLOCK_SIZE_K), tl.zeros_like(acc), SWAP_AB)
                else:  # the activations split the same way, two dots of K / 2
                    if A_QUADS:  # columns k0-3 (a1) and k4-7 (a2) of every eight, loaded as such
                        q = tl.arange(0, BLOCK_SIZE_K // 2)
                        offs_q = k0 + (q // 4) * 8 + q % 4
                        a1 = tl.load(a_rows + offs_q[None, :], mask=row_ok[:, None] & (offs_q < K)[None, :],
                                     other=0.0)
                        a2 = tl.load(a_rows + (offs_q + 4)[None, :],
                                     mask=row_ok[:, None] & (offs_q + 4 < K)[None, :], other=0.0)
                    else:
                        a1, a2 = _quads(a, BLOCK_SIZE_M, BLOCK_SIZE_K)
                    part = _mm(a2, b2, _mm(a1, b, tl.zeros_like(acc), SWAP_AB), SWAP_AB)
            else:
                # Weights as fp16 w16 = e2m1 * 2^W16_EXP, exact (subnormals included).
                if UNPACK == 1:
                    w16 = _e4m3_raw(packed, BLOCK_SIZE_N, BLOCK_SIZE_K, USE_ASM).to(tl.float16)
                    W16_EXP: tl.constexpr = -6
                elif UNPACK == 3:  # even-k and odd-k codes stay apart: [BN, BK / 2] each
                    w16, w16_odd = _f16_halves(packed, USE_ASM)
                    W16_EXP: tl.constexpr = -14
                else:
                    w16 = tl.reshape(_f16_codes(packed, BLOCK_SIZE_N, G, USE_ASM),
                                     (BLOCK_SIZE_N, BLOCK_SIZE_K))
                    W16_EXP: tl.constexpr = -14
                if DECODE != 0:  # re-based on the chunk's (or row's) largest scale: fp8 or fp16 operands
                    if DECODE == 4:
                        smax = rmax
                    else:
                        smax = tl.max(s, axis=1)  # [BN]
                    d = tl.minimum(smax[:, None] - s, 15 - W16_EXP)  # keeps the factor a normal fp16
                    # 2^(1 - W16_EXP - d)
                    fac = ((16 - W16_EXP - d) << 10).to(tl.int16).to(tl.float16, bitcast=True)
                    if DECODE == 3:
                        a_op = a.to(tl.float16)  # e4m3 values are exact in fp16
                        b_dtype: tl.constexpr = tl.float16
                    else:
                        a_op = a
                        b_dtype: tl.constexpr = tl.float8e4nv
                else:
                    fac = ((s - W16_EXP) << 23).to(tl.float32, bitcast=True)  # 2^(s - 127 - W16_EXP)
                    if BLOCK_SIZE_K <= 128:
                        xs2 = tl.load(as_rows + k0 // 128, mask=row_ok, other=0.0)[:, None]
                    else:
                        xs2 = tl.load(as_rows[:, None] + offs_k[None, :] // 128,
                                      mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    # The CPU interpreter's bf16 dot is wrong (Triton 3.9); the values are exact in fp32 too.
                    if F32_DOT:
                        b_dtype: tl.constexpr = tl.float32
                    else:
                        b_dtype: tl.constexpr = tl.bfloat16
                    a_op = (a.to(tl.float32) * xs2).to(b_dtype)
                # e2m1 * 2^(1 - d), |b| <= 12 (re-based), or the exact bf16 weight
                if UNPACK == 3:
                    a_even, a_odd = tl.split(tl.reshape(a_op, (BLOCK_SIZE_M, BLOCK_SIZE_K // 2, 2)))
                    b = _scaled(w16, fac, BLOCK_SIZE_N, G, 16, b_dtype, DECODE == 0)
                    b_odd = _scaled(w16_odd, fac, BLOCK_SIZE_N, G, 16, b_dtype, DECODE == 0)
                else:
                    b = _scaled(w16, fac, BLOCK_SIZE_N, G, 32, b_dtype, DECODE == 0)
                if DECODE == 0:
                    part = acc  # the bf16 weights are exact: one accumulator over all of K
                else:
                    part = tl.zeros_like(acc)
                if UNPACK == 3:
                    part = _mm(a_odd, b_odd, _mm(a_even, b, part, SWAP_AB), SWAP_AB)
                else:
                    part = _mm(a_op, b, part, SWAP_AB)
            if DECODE == 0:
                acc = part
            else:
                if not SCALE_AHEAD:
                    xs = tl.load(as_rows + k0 // 128, mask=row_ok, other=0.0)
                if DECODE == 4:  # the row factor waits for the end of the K loop
                    acc += part * _rows(xs, SWAP_AB)
                else:
                    wf = ((smax - 1) << 23).to(tl.float32, bitcast=True)  # 2^(smax - 128)
                    acc += part * _rows(xs, SWAP_AB) * _cols(wf, SWAP_AB)

    if DECODE == 4:
        acc = acc * _cols(((rmax - 1) << 23).to(tl.float32, bitcast=True), SWAP_AB)  # 2^(rmax - 128)
    c_ptrs = c_ptr + _rows(route.to(tl.int64), SWAP_AB) * stride_cm + _cols(offs_n, SWAP_AB)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=_rows(row_ok, SWAP_AB) & _cols(n_ok, SWAP_AB))


def launch(a, a_scale, w, w_scale, out, align, *, a_div: int, gathered: bool, config) -> None:
    """One grouped GEMM: ``out[route] = A[row(route)] @ W[expert].T`` for every aligned route."""
    bm = config["BLOCK_SIZE_M"]
    if align.block_m != bm:
        raise ValueError(f"alignment was made for BLOCK_SIZE_M {align.block_m}, config has {bm}")
    n = w.shape[1]
    k = a.shape[1]
    blocks = align.max_blocks
    interp = interpreter_active()
    grid = (blocks * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    w_tma = bool(config.get("W_TMA", 0))
    w_strides = w.stride()[:2]
    if w_tma:
        if w.stride(2) != 1 or any(st % 16 for st in w.stride()[:2]) or w.data_ptr() % 16:
            raise ValueError(f"config W_TMA 1 needs packed weights with unit stride along K and 16-byte "
                             f"aligned strides and base, got strides {w.stride()}")
        w = TensorDescriptor(w, list(w.shape), list(w.stride()), [1, config["BLOCK_SIZE_N"],
                                                                  config["BLOCK_SIZE_K"] // 2])
    fp4_moe_gemm_kernel[grid](
        a, a_scale, w, w_scale, out, e4m3_pools(out.device),
        align.sorted_ids, align.expert_ids, align.num_padded,
        n, k, align.routes, blocks,
        a.stride(0), a_scale.stride(0), *w_strides, w_scale.stride(0), w_scale.stride(1),
        out.stride(0),
        A_DIV=a_div, GATHERED=gathered, DECODE=DECODES[config["DECODE"]], UNPACK=UNPACKS[config["UNPACK"]],
        USE_ASM=UNPACKS[config["UNPACK"]] != 0 and not interp,  # the interpreter runs the Triton twin
        SWAP_AB=bool(config.get("SWAP_AB", 0)),
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=config["BLOCK_SIZE_N"], BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"], EVEN_K=k % config["BLOCK_SIZE_K"] == 0, F32_DOT=interp,
        W_TMA=w_tma, SCALE_AHEAD=bool(config.get("SCALE_AHEAD", 0)), A_QUADS=bool(config.get("A_QUADS", 0)),
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
