"""The grouped GEMM of the FP4 prefill path: fp8 activations x MXFP4 expert weights, fp32 accumulation.

One program per (M-block, N-tile) of the expert-aligned routes (see ``moe_align``);
programs past the padded count exit before reading anything. The E2M1 codes are
decoded inside the K loop with integer ops, three ways (the ``DECODE`` switch):

- ``bf16``: codes placed as fp16 bits (``e2m1 * 2^-14`` exactly, subnormals included),
  widened and multiplied by ``2^(scale - 113)``; bf16 dot with A = q * x_scale (exact).
  Valid for scale codes <= 240.
- ``bf16_bits``: the scaled bf16 bits built directly from code and exponent
  (``(c << 6) + ((s - 1) << 7)`` for magnitude codes >= 2, minus 64 for code 1, 0 for
  code 0), no float multiply. Valid for scale codes 2..252.
- ``fp8``: each K chunk's weights re-based on the row's largest scale in the chunk
  (``e2m1 * 2^(1 - d)``, d = smax - s, through one fp16 multiply) and converted to e4m3,
  exact while the chunk's scales differ by at most 9 (beyond, values under 2^-9 of the
  chunk's largest round); fed to the fp8 tensor cores against the raw e4m3 activations,
  the dot rescaled per chunk by ``x_scale[m] * 2^(smax[n] - 128)``. Needs BLOCK_SIZE_K
  <= 128 and scale codes >= 2.

``UNPACK`` picks how nibbles leave their bytes: ``join`` (one load, ``tl.join`` of low
and high nibbles) or ``shift`` (each byte loaded for both of its k, then shifted).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import interpreter_active

DECODES = {"bf16": 0, "bf16_bits": 1, "fp8": 2}
UNPACKS = {"join": 0, "shift": 1}


@triton.jit
def _codes(w_base, offs_n, n_ok, k0, K, stride_wn, BLOCK_SIZE_N: tl.constexpr,
           BLOCK_SIZE_K: tl.constexpr, UNPACK: tl.constexpr):
    """E2M1 codes of one weight tile as int32 [BLOCK_SIZE_N, BLOCK_SIZE_K // 32, 32]."""
    G: tl.constexpr = BLOCK_SIZE_K // 32
    if UNPACK == 0:
        offs_b = k0 // 2 + tl.arange(0, BLOCK_SIZE_K // 2)
        mask = n_ok[:, None] & (offs_b < K // 2)[None, :]
        packed = tl.load(w_base + offs_n[:, None] * stride_wn + offs_b[None, :], mask=mask, other=0)
        codes = tl.join(packed & 0xF, packed >> 4)  # [BN, BK/2, 2]: k = 2 * byte + nibble
        codes = tl.reshape(codes, (BLOCK_SIZE_N, G, 32))
    else:
        offs_k = k0 + tl.arange(0, G)[:, None] * 32 + tl.arange(0, 32)[None, :]  # [G, 32]
        mask = n_ok[:, None, None] & (offs_k < K)[None, :, :]
        packed = tl.load(w_base + offs_n[:, None, None] * stride_wn + (offs_k // 2)[None, :, :],
                         mask=mask, other=0)
        codes = (packed >> ((offs_k % 2) * 4).to(tl.uint8)[None, :, :]) & 0xF
    return codes.to(tl.int32)


@triton.jit
def fp4_moe_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    N, K, routes, num_blocks,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
    A_DIV: tl.constexpr, GATHERED: tl.constexpr, DECODE: tl.constexpr, UNPACK: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, F32_DOT: tl.constexpr,
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
    w_base = w_ptr + expert * stride_we
    ws_base = w_scale_ptr + expert * stride_wse + offs_n[:, None] * stride_wsn
    a_rows = a_ptr + a_row[:, None] * stride_am
    as_rows = a_scale_ptr + a_row * stride_asm
    offs_g = tl.arange(0, G)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_SIZE_K):
        offs_k = k0 + tl.arange(0, BLOCK_SIZE_K)
        k_ok = offs_k < K
        a = tl.load(a_rows + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        g_ok = (k0 // 32 + offs_g) < K // 32
        s = tl.load(ws_base + (k0 // 32 + offs_g)[None, :], mask=n_ok[:, None] & g_ok[None, :],
                    other=127).to(tl.int32)  # [BN, G]
        c = _codes(w_base, offs_n, n_ok, k0, K, stride_wn, BLOCK_SIZE_N, BLOCK_SIZE_K, UNPACK)
        mag = c & 7
        sign = (c & 8) << 12
        if DECODE == 2:
            smax = tl.max(s, axis=1)  # [BN]
            d = tl.minimum(smax[:, None] - s, 29)
            fac = ((30 - d) << 10).to(tl.int16).to(tl.float16, bitcast=True)  # 2^(15 - d)
            w16 = ((mag << 9) | sign).to(tl.int16).to(tl.float16, bitcast=True)  # e2m1 * 2^-14
            b = (w16 * fac[:, :, None]).to(tl.float8e4nv)  # e2m1 * 2^(1 - d), at most 12
            b = tl.reshape(b, (BLOCK_SIZE_N, BLOCK_SIZE_K))
            xs = tl.load(as_rows + k0 // 128, mask=row_ok, other=0.0)
            wf = ((smax - 1) << 23).to(tl.float32, bitcast=True)  # 2^(smax - 128)
            part = tl.dot(a, tl.trans(b))
            acc += part * xs[:, None] * wf[None, :]
        else:
            if DECODE == 0:
                w16 = ((mag << 9) | sign).to(tl.int16).to(tl.float16, bitcast=True)
                fac = ((s + 14) << 23).to(tl.float32, bitcast=True)  # 2^(s - 113)
                b = (w16.to(tl.float32) * fac[:, :, None]).to(tl.bfloat16)
            else:
                base = (mag << 6) + ((s - 1) << 7)[:, :, None]
                bits = tl.where(mag > 1, base, tl.where(mag == 1, base - 64, 0)) | sign
                b = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
            b = tl.reshape(b, (BLOCK_SIZE_N, BLOCK_SIZE_K))
            if BLOCK_SIZE_K <= 128:
                xs = tl.load(as_rows + k0 // 128, mask=row_ok, other=0.0)[:, None]
            else:
                xs = tl.load(as_rows[:, None] + offs_k[None, :] // 128,
                             mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            a16 = (a.to(tl.float32) * xs).to(tl.bfloat16)
            if F32_DOT:  # the CPU interpreter's bf16 dot is wrong (Triton 3.9); values are exact in fp32
                acc = tl.dot(a16.to(tl.float32), tl.trans(b).to(tl.float32), acc)
            else:
                acc = tl.dot(a16, tl.trans(b), acc)

    c_ptrs = c_ptr + route.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def launch(a, a_scale, w, w_scale, out, align, *, a_div: int, gathered: bool, config) -> None:
    """One grouped GEMM: ``out[route] = A[row(route)] @ W[expert].T`` for every aligned route."""
    bm = config["BLOCK_SIZE_M"]
    if align.block_m != bm:
        raise ValueError(f"alignment was made for BLOCK_SIZE_M {align.block_m}, config has {bm}")
    n = w.shape[1]
    k = a.shape[1]
    blocks = align.max_blocks
    grid = (blocks * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    fp4_moe_gemm_kernel[grid](
        a, a_scale, w, w_scale, out,
        align.sorted_ids, align.expert_ids, align.num_padded,
        n, k, align.routes, blocks,
        a.stride(0), a_scale.stride(0), w.stride(0), w.stride(1), w_scale.stride(0), w_scale.stride(1),
        out.stride(0),
        A_DIV=a_div, GATHERED=gathered, DECODE=DECODES[config["DECODE"]], UNPACK=UNPACKS[config["UNPACK"]],
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=config["BLOCK_SIZE_N"], BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
        GROUP_SIZE_M=config["GROUP_SIZE_M"], F32_DOT=interpreter_active(),
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
