"""Prototype (Gluon, sm_90): the FP4 grouped GEMM with the decode overlapped with the tensor cores.

Triton's ``tl.dot`` waits for every wgmma whose operand was made in registers inside the loop
(``warp_group_dot_wait {pendings = 0}`` in every fp4 config's TTGIR), so the `lut` kernel never decodes
chunk k+1 while the tensor cores run chunk k. Here the same math (``DECODE fp8``, ``UNPACK lut``,
``SWAP_AB``: re-based e4m3 weights per 128-K chunk, one fp8 wgmma per chunk, rescale by
``x_scale * 2^(smax - 128)``) is written in Gluon, where the wgmma is issued async and waited for after
the next chunk's decode.

Layout: the A operand (decoded weights, registers) of an sm_90 fp8 wgmma gives lane ``q = lane % 4`` the
K runs ``4q..4q+3`` and ``16+4q..16+4q+3`` of every 32. The K order inside each 128-K chunk is free as long
as both operands follow it, so the kernel assigns thread ``q`` the whole 32-K scale group ``q`` of each of
its rows: logical ``L = 32b + 16h + 4q + i`` is real ``R = 32q + 8b + 4h + i``. A thread then loads its 16
packed bytes of a (row, group) at once, makes that group's e4m3 pool once, and the ``lut`` PTX turns each
4-byte word (b) into the two registers (h = 0, 1) the wgmma wants. The activations must be stored in the
same order (``permute_k``): the path's own quantizer or the gather could write them so.

Not in the package: a GPU-only prototype, timed against the tables' picks by ``--bench``.

    python benchmarks/gluon_fp4.py                 # offline sm_90 compile (Triton 3.6 first on the path)
    python benchmarks/gluon_fp4.py --bench --out $OUT/g   # H200: check against the Triton kernel, time both
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy as cp,
)
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moetune.kernels.fp4_gemm import _E2M1_TO_E4M3_LUT_ASM, _E4M3_POOL_ASM

# cp.async global -> shared: async_copy_global_to_shared in Triton 3.6, async_load in 3.9
_async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
BLOCK_K = gl.constexpr(128)  # one activation scale group: the chunk the rescale runs on


@gluon.constexpr_function
def split_layout(a_lin):
    """The A operand's [BN, 128] layout as [BN, 4(q), 4(b), 2(h), 4(i)] (logical K = 32b + 16h + 4q + i),
    whose slices hold the packed words [BN, q, b] and the lut's output words [BN, q, b, h]. a_lin: the A
    operand as a linear layout."""
    k_to = {
        1: [0, 0, 0, 0, 1],
        2: [0, 0, 0, 0, 2],
        4: [0, 1, 0, 0, 0],
        8: [0, 2, 0, 0, 0],
        16: [0, 0, 0, 1, 0],
        32: [0, 0, 1, 0, 0],
        64: [0, 0, 2, 0, 0],
    }

    def remap(bases):
        return [[n, 0, 0, 0, 0] if k == 0 else k_to[k] for n, k in bases]

    # registers: the word index b right after the bytes of a word, so a thread's 4 words of a (row, group) are
    # consecutive registers and load as one 16-byte vector; the A operand differs only in register order
    reg = remap(a_lin.reg_bases)
    reg = [b for b in reg if b[4]] + [b for b in reg if b[2]] + [b for b in reg if not (b[4] or b[2])]
    return gl.DistributedLinearLayout(
        reg,
        remap(a_lin.lane_bases),
        remap(a_lin.warp_bases),
        remap(a_lin.block_bases),
        [a_lin.shape[0], 4, 4, 2, 4],
    )


# The lut PTX for one packed word per call ($2; pools $3, $4), outputs the two e4m3 words
# ($0: k0-3, $1: k4-7).
_LUT_WORD_ASM = gl.constexpr(_E2M1_TO_E4M3_LUT_ASM.value.replace("$7", "$4"))


@gluon.jit
def _keep_alive(a, never):
    """A use of the A operand's registers after its wgmma's wait (a shared store predicated on a runtime 0):
    fp8 tensors cannot be wait deps (``Unexpected bitwidth in WGMMAWaitGroupOp: 8``), and without a later use
    ptxas reuses those registers for the next decode and moves the wait above it."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $8, 0; @p st.shared.v4.b32 [$8], {$4, $5, $6, $7}; "
        "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r",
        [a.to(gl.uint8, bitcast=True), never],
        dtype=gl.uint8,
        is_pure=False,
        pack=16,
    )


@gluon.jit
def _decode(words, s, rmax, L5: gl.constexpr, BN: gl.constexpr):
    """Packed words [BN, 4(q), 4(b)] int32 (real K order: group q, word b), their group scales s [BN, 4] and
    the row's largest scale rmax [BN, 1] -> the re-based e4m3 words [BN, q, b, h] (int32, 4 weights each).
    Words, not bytes, cross the loop: a byte tensor carried by the loop is 4 registers a word, repacked every
    trip."""
    d = gl.minimum(rmax - s, 15)
    # each thread makes the pools of its own (row, group): ALU work, no table load on the decode's path
    lo, hi = gl.inline_asm_elementwise(
        _E4M3_POOL_ASM, "=r,=r,r", [d], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )
    lo = gl.expand_dims(lo, 2).broadcast_to([BN, 4, 4])
    hi = gl.expand_dims(hi, 2).broadcast_to([BN, 4, 4])
    first, second = gl.inline_asm_elementwise(
        _LUT_WORD_ASM, "=r,=r,r,r,r", [words, lo, hi], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )
    return gl.convert_layout(gl.join(first, second), gl.SliceLayout(4, L5), assert_trivial=True)


@gluon.jit
def _operand(w, A_OP: gl.constexpr, BN: gl.constexpr):
    """Words [BN, q, b, h] -> the fp8 A operand [BN, 128] in logical K order (each word's 4 bytes are 4
    consecutive K of the operand: the asm only renames the register)."""
    w = gl.expand_dims(w, 4).broadcast_to([BN, 4, 4, 2, 4])
    b = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [w], dtype=gl.uint8, is_pure=True, pack=4)
    b = b.permute((0, 2, 3, 1, 4)).reshape([BN, 128])
    return gl.convert_layout(b.to(gl.float8e4nv, bitcast=True), A_OP, assert_trivial=True)


@gluon.jit
def _chunk(
    k,
    num_k,
    x_ring,
    x_rows,
    cols_x,
    row_ok_x,
    w_rows,
    ws_rows,
    as_rows,
    row_ok_m,
    rmax,
    acc,
    a_cur,
    p_next,
    s_next,
    p_far,
    s_far,
    xs,
    w_ring,
    never,
    MMA: gl.constexpr,
    A_OP: gl.constexpr,
    L5: gl.constexpr,
    BN: gl.constexpr,
    BM: gl.constexpr,
    STAGES: gl.constexpr,
    ABLATE: gl.constexpr,
    WRING: gl.constexpr,
    P_W: gl.constexpr,
):
    """One 128-K chunk: wgmma k issued async; while it runs, the X copy of chunk k + STAGES - 1, the decode of
    chunk k + 1 and the loads of chunk k + 3 (two chunks of latency); then the wait and the rescale by the
    chunk's activation scales."""
    slot = k % STAGES
    cp.wait_group(STAGES - 2)
    fence_async_shared()
    zero = gl.zeros([BN, BM], gl.float32, MMA)
    a_op = _operand(a_cur, A_OP, BN)
    part = warpgroup_mma(a_op, x_ring.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)

    kn = gl.minimum(k + STAGES - 1, num_k - 1)  # past the end: a copy of the last chunk, never read
    _async_load(
        x_ring.index((k + STAGES - 1) % STAGES),
        x_rows + kn * BLOCK_K + cols_x[None, :],
        mask=row_ok_x[:, None],
    )
    if WRING:  # the weights ride in the same copy group, STAGES - 1 chunks ahead
        _async_load(w_ring.index((k + STAGES - 1) % STAGES), w_rows + kn * (BLOCK_K // 8))
    cp.commit_group()
    if WRING:  # chunk k + 1's weights have landed; each thread reads back the 16 bytes it copied
        cp.wait_group(STAGES - 2)
        p_next = w_ring.index((k + 1) % STAGES).load(P_W)

    if ABLATE == 1:  # timing only: the packed words go to the tensor cores undecoded
        a_next = gl.convert_layout(gl.join(p_next, p_next), gl.SliceLayout(4, L5))
    else:
        a_next = _decode(p_next, s_next, rmax, L5, BN)
    k3 = gl.minimum(k + 3, num_k - 1)  # past the end: the last chunk again, never used
    p_next, s_next = p_far, s_far
    if ABLATE != 2:  # 2, timing only: the first chunk's weights over and over, no weight loads in the loop
        if not WRING:
            p_far = gl.load(w_rows + k3 * (BLOCK_K // 8))
        s_far = gl.load(ws_rows + k3 * (BLOCK_K // 32)).to(gl.int32)
    xs_next = gl.load(as_rows + gl.minimum(k + 1, num_k - 1), mask=row_ok_m, other=0.0)  # a chunk ahead

    # a_next among the wait's operands: the decode stays ahead of the wait (else ptxas sinks it below)
    part, a_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, a_next])
    _keep_alive(a_op, never)
    acc += part * xs[None, :]
    return acc, a_next, p_next, s_next, p_far, s_far, xs_next


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_kernel(
    a_ptr,
    a_scale_ptr,
    w_ptr,
    w_scale_ptr,
    c_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    N,
    K,
    routes,
    num_blocks,
    stride_am,
    stride_asm,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_cm,
    GROUP_SIZE_M,
    A_DIV: gl.constexpr,
    BLOCK_SIZE_M: gl.constexpr,
    BLOCK_SIZE_N: gl.constexpr,
    STAGES: gl.constexpr,
    ABLATE: gl.constexpr,
    WRING: gl.constexpr,
    num_warps: gl.constexpr,
):
    """N % BLOCK_SIZE_N == 0, K % 256 == 0 (no masks on the weights)."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid = gl.program_id(0)
    num_pid_n = N // BN
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = gl.minimum(num_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    if pid_m * BM >= gl.load(num_padded_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 32]
    )
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    L5: gl.constexpr = split_layout(gl.to_linear_layout(A_OP, [BN, BLOCK_K]))
    P_W: gl.constexpr = gl.SliceLayout(3, gl.SliceLayout(4, L5))  # packed words [BN, q, b]
    S2: gl.constexpr = gl.SliceLayout(2, P_W)  # group scales [BN, q]
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BLOCK_K], gl.float8e4nv)

    # packed weights as int32 words [BN, 4 groups, 4 words] and their group scales [BN, 4]
    n_w = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, gl.SliceLayout(2, P_W)))
    q_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, P_W)))
    b_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, P_W)))
    offs_w = gl.expand_dims(gl.expand_dims(q_w * 4, 0), 2) + gl.expand_dims(gl.expand_dims(b_w, 0), 1)
    w_rows = (
        w_ptr
        + expert * stride_we
        + gl.expand_dims(gl.expand_dims(n_w.to(gl.int64) * stride_wn, 1), 2)
        + offs_w
    )
    n_g = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, S2))
    ws_rows = (
        w_scale_ptr
        + expert * stride_wse
        + gl.expand_dims(n_g.to(gl.int64) * stride_wsn, 1)
        + gl.expand_dims(gl.arange(0, 4, gl.SliceLayout(0, S2)), 0)
    )

    # activation rows of this M-block (cp.async, 16 bytes a thread) and their scales (accumulator columns)
    slot_x = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, X_LOAD))
    route_x = gl.load(sorted_ids_ptr + slot_x)
    row_ok_x = route_x < routes
    x_rows = a_ptr + gl.where(row_ok_x, route_x // A_DIV, 0).to(gl.int64)[:, None] * stride_am
    cols_x = gl.arange(0, BLOCK_K, gl.SliceLayout(0, X_LOAD))
    slot_m = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(0, MMA))
    route_m = gl.load(sorted_ids_ptr + slot_m)
    row_ok_m = route_m < routes
    as_rows = a_scale_ptr + gl.where(row_ok_m, route_m // A_DIV, 0).to(gl.int64) * stride_asm

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BLOCK_K], X_SMEM)
    # WRING: the packed words by cp.async too (16 bytes a thread, read back by the same thread)
    w_ring = gl.allocate_shared_memory(gl.int32, [STAGES if WRING else 1, BN, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    for i in gl.static_range(STAGES - 1):
        _async_load(x_ring.index(i), x_rows + i * BLOCK_K + cols_x[None, :], mask=row_ok_x[:, None])
        if WRING:
            _async_load(w_ring.index(i), w_rows + i * (BLOCK_K // 8))
        cp.commit_group()

    # the largest scale of each weight row (DECODE fp8_row): the weight factor waits for the end
    num_k = K // BLOCK_K
    smax = gl.zeros([BN, 4], gl.int32, S2)
    for k0 in range(0, num_k, 8):  # eight loads in flight: Gluon does not pipeline loops
        for u in gl.static_range(8):
            k = gl.minimum(k0 + u, num_k - 1)
            smax = gl.maximum(smax, gl.load(ws_rows + k * (BLOCK_K // 32)).to(gl.int32))
    rmax = gl.expand_dims(gl.max(smax, axis=1), 1)

    if WRING:
        cp.wait_group(STAGES - 2)
        a_cur = _decode(w_ring.index(0).load(P_W), gl.load(ws_rows).to(gl.int32), rmax, L5, BN)
    else:
        a_cur = _decode(gl.load(w_rows), gl.load(ws_rows).to(gl.int32), rmax, L5, BN)
    p_next = gl.load(w_rows + BLOCK_K // 8)
    s_next = gl.load(ws_rows + BLOCK_K // 32).to(gl.int32)
    p_far = gl.load(w_rows + 2 * (BLOCK_K // 8))
    s_far = gl.load(ws_rows + 2 * (BLOCK_K // 32)).to(gl.int32)
    xs = gl.load(as_rows, mask=row_ok_m, other=0.0)
    never = (gl.full([BN, BLOCK_K], stride_cm, gl.int32, A_OP) < 0).to(gl.uint8)  # a runtime 0
    acc = gl.zeros([BN, BM], gl.float32, MMA)

    # two chunks a trip: the decode of chunk k + 1 must not write the registers wgmma k still reads
    for k0 in range(0, num_k, 2):
        for u in gl.static_range(2):
            acc, a_cur, p_next, s_next, p_far, s_far, xs = _chunk(
                k0 + u,
                num_k,
                x_ring,
                x_rows,
                cols_x,
                row_ok_x,
                w_rows,
                ws_rows,
                as_rows,
                row_ok_m,
                rmax,
                acc,
                a_cur,
                p_next,
                s_next,
                p_far,
                s_far,
                xs,
                w_ring,
                never,
                MMA,
                A_OP,
                L5,
                BN,
                BM,
                STAGES,
                ABLATE,
                WRING,
                P_W,
            )
    cp.wait_group(0)

    wf = ((gl.convert_layout(gl.reshape(rmax, [BN]), gl.SliceLayout(1, MMA)) - 1) << 23).to(
        gl.float32, bitcast=True
    )
    n_c = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, MMA))
    c_ptrs = c_ptr + route_m.to(gl.int64)[None, :] * stride_cm + n_c[:, None]
    gl.store(c_ptrs, (acc * wf[:, None]).to(c_ptr.dtype.element_ty), mask=row_ok_m[None, :])


def permute_k(a: torch.Tensor) -> torch.Tensor:
    """Activations [rows, K] in the kernel's K order: within each 128-K chunk, logical 32b + 16h + 4q + i
    holds real 32q + 8b + 4h + i."""
    rows, k = a.shape
    v = a.view(torch.uint8).reshape(rows, k // 128, 4, 4, 2, 4)  # [rows, chunk, q, b, h, i] (real order)
    return v.permute(0, 1, 3, 4, 2, 5).reshape(rows, k).contiguous().view(a.dtype)


def launch(a_perm, a_scale, w, w_scale, out, align, *, a_div: int, config: dict) -> None:
    """As ``fp4_gemm.launch`` (indexed A rows), with ``a_perm`` in ``permute_k`` order; K % 256 == 0."""
    n, k = w.shape[1], a_perm.shape[1]
    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    if k % (2 * BLOCK_K.value) or n % bn:
        raise ValueError(
            f"the prototype needs K a multiple of {2 * BLOCK_K.value} and N of {bn}, got {k}, {n}"
        )
    grid = (align.max_blocks * (n // bn),)
    w = w.view(torch.int32)  # packed words: 8 codes each
    fp4_wgmma_kernel[grid](
        a_perm,
        a_scale,
        w,
        w_scale,
        out,
        align.sorted_ids,
        align.expert_ids,
        align.num_padded,
        n,
        k,
        align.routes,
        align.max_blocks,
        a_perm.stride(0),
        a_scale.stride(0),
        w.stride(0),
        w.stride(1),
        w_scale.stride(0),
        w_scale.stride(1),
        out.stride(0),
        config.get("GROUP_SIZE_M", 8),
        A_DIV=a_div,
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        STAGES=config.get("STAGES", 3),
        ABLATE=config.get("ABLATE", 0),
        WRING=config.get("WRING", 0),
        num_warps=config["num_warps"],
        **({"maxnreg": config["maxnreg"]} if "maxnreg" in config else {}),
    )


# ------------------------------------------------------------------------------------------ offline compile
def compile_sm90(config: dict, a_div: int = 6):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = fp4_wgmma_kernel
    params = list(inspect.signature(fn.fn).parameters)
    const = dict(
        A_DIV=a_div,
        BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
        BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
        STAGES=config.get("STAGES", 3),
        ABLATE=config.get("ABLATE", 0),
        WRING=config.get("WRING", 0),
        num_warps=config["num_warps"],
    )
    types = {
        "a_ptr": "*fp8e4nv",
        "a_scale_ptr": "*fp32",
        "w_ptr": "*i32",
        "w_scale_ptr": "*u8",
        "c_ptr": "*fp32",
        "sorted_ids_ptr": "*i32",
        "expert_ids_ptr": "*i32",
        "num_padded_ptr": "*i32",
    }
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    aligned = [
        p
        for p in params
        if p not in const and (p.startswith("stride") or p in ("N", "K") or p.endswith("_ptr"))
    ]
    src = GluonASTSource(
        fn,
        sig,
        constexprs={(params.index(x),): v for x, v in const.items()},
        attrs={(params.index(x),): [["tt.divisibility", 16]] for x in aligned},
    )
    options = {"num_warps": config["num_warps"]}
    if "maxnreg" in config:
        options["maxnreg"] = config["maxnreg"]
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def offline(configs: list[dict]) -> None:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for config in configs:
        kernel = compile_sm90(config)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            Path(path).write_bytes(kernel.asm["cubin"])
            usage = subprocess.run(
                [tool, "-res-usage", path], capture_output=True, text=True, check=True
            ).stdout
            sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
        ops = re.findall(r"\b([A-Z][A-Z0-9]*)(?:\.[A-Z0-9x_]+)* ", sass)
        count = {
            op: ops.count(op)
            for op in ("QGMMA", "LDG", "LDGSTS", "LDS", "STS", "BAR", "PRMT", "SHFL", "LDL", "STL")
        }
        print(
            json.dumps(config),
            "regs",
            re.search(r"REG:(\d+)", usage).group(1),
            "smem",
            kernel.metadata.shared,
            count,
            "ttgir waits",
            re.findall(r"pendings = (\d+)", kernel.asm["ttgir"]),
        )


# ------------------------------------------------------------------------------------------------- H200 bench
def bench(out_dir: Path, routes_list: list[int], configs: list[dict]) -> None:
    from moetune.kernels import fp4_gemm
    from moetune.kernels.moe_align import align_routes
    from moetune.picker import pick_config
    from moetune.quant.fp8_act import quantize_fp8_act
    from moetune.quant.mxfp4 import quantize_mxfp4

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows = []
    for gemm, (n, k, a_div) in {"gate_up": (2048, 4096, 6), "down": (4096, 1024, 1)}.items():
        e = 256
        w, ws = quantize_mxfp4(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
        for routes in routes_list:
            tokens = routes // 6
            m_rows = tokens if a_div == 6 else routes
            a, a_s = quantize_fp8_act(torch.randn(m_rows, k, device="cuda"))
            topk = torch.stack([torch.randperm(e, device="cuda")[:6] for _ in range(tokens)]).to(torch.int32)
            pick = pick_config(f"fp4_prefill.{gemm}", {"E": e, "N": n, "K": k, "top_k": 6}, routes)
            align = align_routes(topk, e, pick["BLOCK_SIZE_M"])
            ref = torch.empty(routes, n, device="cuda", dtype=torch.float32)
            fp4_gemm.launch(a, a_s, w, ws, ref, align, a_div=a_div, gathered=False, config=pick)
            t_pick = triton.testing.do_bench_cudagraph(
                lambda a=a, a_s=a_s, w=w, ws=ws, ref=ref, align=align, a_div=a_div, pick=pick: (
                    fp4_gemm.launch(a, a_s, w, ws, ref, align, a_div=a_div, gathered=False, config=pick)
                )
            )
            rows.append(
                {
                    "gemm": gemm,
                    "routes": routes,
                    "variant": "table pick",
                    "config": pick,
                    "us": t_pick * 1e3,
                    "rel_err": 0.0,
                }
            )
            a_p = permute_k(a)
            for cfg in configs:
                al = align_routes(topk, e, cfg["BLOCK_SIZE_M"])
                out = torch.full((routes, n), float("nan"), device="cuda", dtype=torch.float32)
                try:
                    launch(a_p, a_s, w, ws, out, al, a_div=a_div, config=cfg)
                    torch.cuda.synchronize()
                    err = ((out - ref).norm() / ref.norm()).item()
                    t = (
                        triton.testing.do_bench_cudagraph(
                            lambda a_p=a_p, a_s=a_s, w=w, ws=ws, out=out, al=al, a_div=a_div, cfg=cfg: launch(
                                a_p, a_s, w, ws, out, al, a_div=a_div, config=cfg
                            )
                        )
                        if err < 1e-3 or cfg.get("ABLATE")
                        else None
                    )
                except Exception as exc:  # a config that does not compile is a row, not a stop
                    err, t = None, None
                    print(gemm, routes, cfg, "failed:", str(exc).splitlines()[-1][:300])
                rows.append(
                    {
                        "gemm": gemm,
                        "routes": routes,
                        "variant": "gluon",
                        "config": cfg,
                        "us": t * 1e3 if t else None,
                        "rel_err": err,
                    }
                )
                print(rows[-1], flush=True)
    (out_dir / "gluon_fp4.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "| gemm | routes | variant | config | us | x pick | rel err |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    base = {(r["gemm"], r["routes"]): r["us"] for r in rows if r["variant"] == "table pick"}
    for r in rows:
        c = r["config"]
        desc = f"BM{c['BLOCK_SIZE_M']} BN{c['BLOCK_SIZE_N']} w{c['num_warps']}" + (
            f" s{c.get('STAGES', 3)}" if r["variant"] == "gluon" else f" {c['UNPACK']} {c['DECODE']}"
        )
        us = f"{r['us']:.1f}" if r["us"] else "-"
        x = f"{base[(r['gemm'], r['routes'])] / r['us']:.3f}x" if r["us"] else "-"
        err = f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "fail"
        lines.append(f"| {r['gemm']} | {r['routes']} | {r['variant']} | {desc} | {us} | {x} | {err} |")
    (out_dir / "gluon_fp4.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true", help="check and time on the GPU")
    ap.add_argument("--out", type=Path, default=Path("gluon_out"))
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576])
    ap.add_argument(
        "--configs",
        nargs="+",
        default=[
            '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4}',
            '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "num_warps": 8}',
            '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_warps": 4}',
            '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "num_warps": 8}',
            '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "num_warps": 4}',
            '{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "num_warps": 8}',
        ],
    )
    args = ap.parse_args()
    configs = [json.loads(c) for c in args.configs]
    if args.bench:
        bench(args.out, args.routes, configs)
    else:
        offline(configs)


if __name__ == "__main__":
    main()
