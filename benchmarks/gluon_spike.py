"""Gluon feasibility spike: FP4 (e2m1 codes) x FP8 GEMM tile loop on sm_90 with an ASYNC wgmma whose A operand
is decoded in registers, so the decode of K step k+1 can sit between the wgmma issue of step k and its wait.

SWAP_AB form: out^T[N, M] = W[N, K] @ X[M, K]^T, per K chunk: part = W_k @ X_k^T (fp8 wgmma, fresh fp32 zero
accumulator), acc += part * scale[n, k_chunk]. One program per BLOCK_N rows of W, one warpgroup (4 warps).

- W: uint8 [N, K/2], byte j of a row holds codes of columns 2j (low nibble) and 2j+1 (high nibble). Each 4-bit
  code s|e1 e0|m is decoded to the e4m3 byte s|0 0 e1 e0|m 0 0 (the e2m1 value times 2^-6) with bit ops,
  loaded with plain global loads one step ahead, in a register layout chosen so that the join/reshape to
  [BLOCK_N, BLOCK_K] lands directly in wgmma's A-operand layout
  (checked: convert_layout(assert_trivial=True)).
- X: float8e4nv [M, K] (M = 32 tokens), streamed through a STAGES-deep shared-memory ring (NVMMASharedLayout)
  with cp.async (3.6 async_copy_global_to_shared, 3.9 async_load; commit_group / wait_group); B = ring slot
  permuted to [K, M].
- scale: fp32 [N, K/BLOCK_K], one per row per K chunk.

Modes (from the repo root):
    PYTHONPATH=/tmp/t36:. python benchmarks/gluon_spike.py   # offline sm_90 compile, no GPU: regs, smem, SASS
    python benchmarks/gluon_spike.py --gpu                    # check against PyTorch and time (H200)

Variants "WAIT/UNROLL/KEEP" (--variants; the first is the main form):
    WAIT 0: issue wgmma k async, load+decode W chunk k+1, then wait(0) and rescale     (the spike's main form)
    WAIT 1: issue wgmma k async, wait(num_outstanding=1) (wgmma k-1 done), decode k+1
    WAIT 2: baseline: wait(0) right after the issue, decode afterwards (synchronous, like today's tl.dot loop)
    UNROLL 2: two K steps per loop trip, so the decode of step k+1 does not redefine the PTX registers that
        the in-flight wgmma k reads (with UNROLL 1, Triton 3.6's ptxas serializes every wgmma: C7513)
    KEEP 1: after the wait, a store predicated on a runtime 0 reads the A operand's packed registers. fp8
        register operands cannot go in warpgroup_mma_wait(deps=...) ("Unexpected bitwidth in
        WGMMAWaitGroupOp: 8", 3.6 and 3.9), so without it ptxas sees them dead after the issue, reuses them
        for the next decode and hoists the wait above that decode (no overlap in SASS)
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile

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

# cp.async global->shared: `async_copy_global_to_shared` in Triton 3.6, renamed `async_load` in 3.9
# (old name raises)
_async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared


@gluon.constexpr_function
def packed_layout(a_lin):
    """The register layout of the packed bytes [BN, BK/2] whose join(lo, hi) + reshape is the A-operand
    layout.

    a_lin: the A-operand layout as a linear layout over [BN, BK]. Column bit 0 (the nibble: low = even column)
    must be its first register basis; drop it and halve the other column components."""
    reg = [list(b) for b in a_lin.reg_bases]
    assert reg[0] == [0, 1], f"expected column bit 0 as the first register basis, got {reg}"

    def half(bases):
        out = []
        for b in bases:
            assert b[1] != 1, bases
            out.append([b[0], b[1] // 2])
        return out

    shape = [a_lin.shape[0], a_lin.shape[1] // 2]
    return gl.DistributedLinearLayout(
        half(reg[1:]), half(a_lin.lane_bases), half(a_lin.warp_bases), half(a_lin.block_bases), shape
    )


@gluon.jit
def _decode(p, A_OP: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    # p: uint8 [BN, BK/2]; low nibble -> even column, high nibble -> odd column; e2m1 -> e4m3 (x 2^-6)
    lo = ((p << 2) & 0x1C) | ((p << 4) & 0x80)
    hi = ((p >> 2) & 0x1C) | (p & 0x80)
    w = gl.join(lo.to(gl.uint8), hi.to(gl.uint8)).reshape([BLOCK_N, BLOCK_K])
    w = w.to(gl.float8e4nv, bitcast=True)
    return gl.convert_layout(w, A_OP, assert_trivial=True)


@gluon.jit
def _keep_alive(a, never):
    """A PTX use of the A operand's packed registers after the wgmma wait (a store predicated on a runtime 0),
    so that ptxas cannot reuse them for the next step's decode and hoist the wait above it.
    `never`: uint8, 0."""
    # pack=16: one asm per 4 packed registers (16 fp8); outputs $0-$3 (dummies), A regs $4-$7,
    # flag regs $8-$11
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
def _k_step(
    k,
    K,
    x_ring,
    x_ptrs,
    cols_x,
    w_ptrs,
    cols_p,
    s_ptrs,
    acc,
    a_cur,
    a_prev,
    p_next,
    prev,
    s_prev,
    zero,
    never,
    A_OP: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr,
    WAIT: gl.constexpr,
    KEEP: gl.constexpr,
):
    HALF_K: gl.constexpr = BLOCK_K // 2
    slot = k % STAGES
    # X chunk k has landed (at most STAGES-2 younger groups pending); make it visible to wgmma (async proxy)
    cp.wait_group(STAGES - 2)
    fence_async_shared()
    b = x_ring.index(slot).permute((1, 0))  # [BLOCK_K, BLOCK_M], K-major, as fp8 wgmma requires
    part = warpgroup_mma(a_cur, b, zero, use_acc=False, is_async=True)
    if WAIT == 2:
        part = warpgroup_mma_wait(num_outstanding=0, deps=[part])
    if WAIT == 1:
        # wgmma k-1 done (k may still run): its ring slot is free, its part can be folded in
        prev, part = warpgroup_mma_wait(num_outstanding=1, deps=[prev, part])
        if KEEP:
            _keep_alive(a_prev, never)  # wgmma k-1's A operand
        acc += prev * s_prev[:, None]

    # refill: X chunk k+STAGES-1 into the slot wgmma k-1 read (done: waited above / in step k-1)
    kn = k + STAGES - 1
    _async_load(x_ring.index(kn % STAGES), x_ptrs + kn * BLOCK_K, mask=(cols_x < K - kn * BLOCK_K)[None, :])
    cp.commit_group()

    # while wgmma k runs: decode W chunk k+1, load packed W chunk k+2 and this step's scale
    a_next = _decode(p_next, A_OP, BLOCK_N, BLOCK_K)
    p_next = gl.load(w_ptrs + (k + 2) * HALF_K, mask=(cols_p < K // 2 - (k + 2) * HALF_K)[None, :], other=0)
    sc = gl.load(s_ptrs + k)

    if WAIT == 1:
        prev = part
        s_prev = sc
    else:
        if WAIT == 0:
            part = warpgroup_mma_wait(num_outstanding=0, deps=[part])
            if KEEP:
                _keep_alive(a_cur, never)
        acc += part * sc[:, None]
    return acc, a_next, a_cur, p_next, prev, s_prev


@gluon.jit
def fp4_swap_ab_kernel(
    w_ptr,
    x_ptr,
    s_ptr,
    out_ptr,
    N,
    K,
    stride_wn,
    stride_xm,
    stride_sn,
    stride_on,
    BLOCK_N: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_K: gl.constexpr,
    STAGES: gl.constexpr,
    WAIT: gl.constexpr,
    UNROLL: gl.constexpr,
    KEEP: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4)
    pid = gl.program_id(0)
    off_n = pid * BLOCK_N
    HALF_K: gl.constexpr = BLOCK_K // 2

    # wgmma: m16 x n(BLOCK_M) x k32 (fp8) per instruction, 4 warps along N (rows of W)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 32]
    )
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    P_LAYOUT: gl.constexpr = packed_layout(gl.to_linear_layout(A_OP, [BLOCK_N, BLOCK_K]))
    # X tile [BLOCK_M, BLOCK_K]: one 16-byte cp.async per thread (32 x 64 bytes with 128 threads)
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv)

    # packed-weight pointers (in the layout that decodes straight into the A operand)
    rows_p = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, P_LAYOUT))
    cols_p = gl.arange(0, HALF_K, gl.SliceLayout(0, P_LAYOUT))
    w_ptrs = w_ptr + rows_p[:, None] * stride_wn + cols_p[None, :]
    # X pointers
    rows_x = gl.arange(0, BLOCK_M, gl.SliceLayout(1, X_LOAD))
    cols_x = gl.arange(0, BLOCK_K, gl.SliceLayout(0, X_LOAD))
    x_ptrs = x_ptr + rows_x[:, None] * stride_xm + cols_x[None, :]
    # scale pointers (one fp32 per row per K chunk), in the accumulator's row layout
    rows_s = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(1, MMA))
    s_ptrs = s_ptr + rows_s * stride_sn

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], X_SMEM)
    num_k = K // BLOCK_K

    # prologue: X chunks 0 .. STAGES-2 in flight; packed W chunk 0 decoded, chunk 1 loaded
    for i in gl.static_range(STAGES - 1):
        _async_load(x_ring.index(i), x_ptrs + i * BLOCK_K, mask=(cols_x < K - i * BLOCK_K)[None, :])
        cp.commit_group()
    a_cur = _decode(gl.load(w_ptrs), A_OP, BLOCK_N, BLOCK_K)
    a_prev = a_cur  # WAIT == 1: the A operand of the wgmma still in flight
    p_next = gl.load(w_ptrs + HALF_K, mask=(cols_p < (K - BLOCK_K) // 2)[None, :], other=0)

    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
    never = gl.full([BLOCK_N, BLOCK_K], stride_on, gl.int32, A_OP) < 0  # runtime 0 (KEEP)
    never = never.to(gl.uint8)
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, MMA)
    prev = zero  # WAIT == 1: the part of step k-1 (still in flight)
    s_prev = gl.load(s_ptrs)

    # UNROLL=2: two K steps per trip, so the decode of step k+1 writes registers other than the A operand
    # wgmma k is still reading (with UNROLL=1 the loop-carried A value reuses them: ptxas serializes, C7513)
    for k0 in range(0, num_k, UNROLL):
        for u in gl.static_range(UNROLL):
            acc, a_cur, a_prev, p_next, prev, s_prev = _k_step(
                k0 + u,
                K,
                x_ring,
                x_ptrs,
                cols_x,
                w_ptrs,
                cols_p,
                s_ptrs,
                acc,
                a_cur,
                a_prev,
                p_next,
                prev,
                s_prev,
                zero,
                never,
                A_OP,
                BLOCK_N,
                BLOCK_K,
                STAGES,
                WAIT,
                KEEP,
            )

    if WAIT == 1:
        prev = warpgroup_mma_wait(num_outstanding=0, deps=[prev])
        acc += prev * s_prev[:, None]
    cp.wait_group(0)

    cols_o = gl.arange(0, BLOCK_M, gl.SliceLayout(0, MMA))
    gl.store(out_ptr + rows_s[:, None] * stride_on + cols_o[None, :], acc)


BLOCK_N, BLOCK_M, BLOCK_K, STAGES = 128, 32, 64, 3


# variants: "WAIT/UNROLL/KEEP"; the first is the spike's main form
VARIANTS = ["0/2/1", "1/2/1", "0/2/0", "0/1/0", "1/2/0", "2/2/0"]


def constexprs(variant: str) -> dict:
    wait, unroll, keep = map(int, variant.split("/"))
    return dict(
        BLOCK_N=BLOCK_N,
        BLOCK_M=BLOCK_M,
        BLOCK_K=BLOCK_K,
        STAGES=STAGES,
        WAIT=wait,
        UNROLL=unroll,
        KEEP=keep,
        num_warps=4,
    )


# -------------------------------------------------------------------------------------------- offline compile
def compile_sm90(variant: str):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = fp4_swap_ab_kernel
    params = list(inspect.signature(fn.fn).parameters)
    const = constexprs(variant)
    types = {"w_ptr": "*u8", "x_ptr": "*fp8e4nv", "s_ptr": "*fp32", "out_ptr": "*fp32"}
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    aligned = [p for p in params if p not in const and p != "stride_sn"]
    src = GluonASTSource(
        fn,
        sig,
        constexprs={(params.index(k),): v for k, v in const.items()},
        attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned},
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


_MARKS = ("WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "QGMMA", "WGMMA")
_DECODE = ("LOP3", "SHF", "PRMT", "IMAD.SHL", "SHL", "LEA")


def sass_of(kernel) -> tuple[str, str]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    return usage, sass


def sass_lines(sass: str) -> list[tuple[int, str]]:
    return [
        (int(m.group(1), 16), m.group(2).strip())
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*;)", sass)
    ]


def loop_span(lines):
    """The longest backward branch: the K loop."""
    spans = [
        (addr - int(m.group(1), 16), int(m.group(1), 16), addr)
        for addr, text in lines
        if (m := re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)", text))
        and int(m.group(1), 16) < addr
    ]
    if not spans:
        return None
    _, start, end = max(spans)
    return start, end


def report(variant: str, context: int) -> None:
    kernel = compile_sm90(variant)
    usage, sass = sass_of(kernel)
    regs = re.search(r"REG:(\d+)", usage).group(1)
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the ptxas Triton itself uses for sm_90 (3.9: ptxas-blackwell, CUDA 13)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "k.ptx"), "w") as f:
            f.write(kernel.asm["ptx"])
        info = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", os.path.join(tmp, "k.ptx"), "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
        ).stderr
    warns = [line.split(": ", 1)[1] for line in info.splitlines() if "C75" in line or "arning" in line]
    lines = sass_lines(sass)
    span = loop_span(lines)
    version = (
        subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    )
    print(
        f"=== WAIT/UNROLL/KEEP={variant} ({version}): regs {regs}, shared {kernel.metadata.shared} B, "
        f"SASS {len(lines)} instructions, "
        f"K loop {hex(span[0]) if span else '?'}..{hex(span[1]) if span else '?'}"
    )
    for w in warns:
        print("ptxas:", w)
    ttgir = kernel.asm["ttgir"]
    print("ttgir wgmma waits:", re.findall(r"warp_group_dot_wait .*?pendings = (\d+)", ttgir))
    if not span:
        return
    loop = [(a, t) for a, t in lines if span[0] <= a <= span[1]]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in loop]
    marks = [i for i, op in enumerate(ops) if any(op.startswith(m) for m in _MARKS)]
    print(
        f"loop: {len(loop)} instrs; "
        + ", ".join(
            f"{m}: {sum(op.startswith(m) for op in ops)}"
            for m in _MARKS + _DECODE + ("LDG", "LDGSTS", "BAR", "FFMA", "FMUL")
        )
    )
    # position of the decode instructions relative to the first QGMMA issue and the DEPBAR (wait)
    q = [i for i, op in enumerate(ops) if op.startswith(("QGMMA", "WGMMA"))]
    d = [i for i, op in enumerate(ops) if op.startswith("WARPGROUP.DEPBAR")]
    if q and d:
        last_q = q[-1]
        after = [i for i in d if i > last_q]
        wait_i = after[0] if after else d[-1]
        between = ops[last_q + 1 : wait_i] if wait_i > last_q else []
        dec = sum(op.startswith(_DECODE) for op in between)
        print(
            f"between last QGMMA (#{last_q}) and next DEPBAR (#{wait_i}): {len(between)} instrs, "
            f"{dec} decode-type ({'/'.join(_DECODE)}), {sum(op.startswith('LDG') for op in between)} LDG"
        )
    # the loop as segments between wgmma marks: what runs between issue (QGMMA) and wait (DEPBAR)
    print("loop segments (between consecutive ARRIVE/QGMMA/DEPBAR/BAR marks):")
    seg_marks = [i for i, op in enumerate(ops) if op.startswith(_MARKS + ("BAR.SYNC",))]
    bounds = [-1] + seg_marks + [len(ops)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        seg = ops[lo + 1 : hi]
        if seg:
            cnt = {
                m: sum(op.startswith(m) for op in seg)
                for m in ("LOP3", "SHF", "PRMT", "IMAD.SHL", "LDG", "FFMA")
            }
            print(f"    {len(seg):4d} instrs  " + " ".join(f"{m}={c}" for m, c in cnt.items() if c))
        if hi < len(ops):
            print(f"  {loop[hi][0]:05x}  {loop[hi][1]}")
    shown = set()
    for i in marks:
        shown.update(range(max(0, i - context), min(len(loop), i + context + 1)))
    last = -2
    for i in sorted(shown):
        if i != last + 1:
            print("        ...")
        a, t = loop[i]
        print(f"  {a:05x}  {t}")
        last = i
    print()


# -------------------------------------------------------------------------------------------- GPU check
def reference(w_packed, x, scale):
    import torch

    lo = ((w_packed << 2) & 0x1C) | ((w_packed << 4) & 0x80)
    hi = ((w_packed >> 2) & 0x1C) | (w_packed & 0x80)
    w8 = torch.stack([lo, hi], dim=-1).reshape(w_packed.shape[0], -1).contiguous()
    w = w8.view(torch.float8_e4m3fn).float()
    xf = x.float()
    n, k = w.shape
    out = torch.zeros(n, x.shape[0], device=w.device, dtype=torch.float32)
    for j in range(k // BLOCK_K):
        sl = slice(j * BLOCK_K, (j + 1) * BLOCK_K)
        out += (w[:, sl] @ xf[:, sl].T) * scale[:, j : j + 1]
    return out


def gpu(n: int, k: int, variants) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    dev = "cuda"
    w_packed = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.uint8)
    x = (torch.randn(BLOCK_M, k, device=dev) * 4).to(torch.float8_e4m3fn)
    scale = torch.rand(n, k // BLOCK_K, device=dev) * 2**6
    ref = reference(w_packed, x, scale)
    for variant in variants:
        out = torch.empty(n, BLOCK_M, device=dev, dtype=torch.float32)

        def launch(out=out, variant=variant):
            fp4_swap_ab_kernel[(n // BLOCK_N,)](
                w_packed,
                x,
                scale,
                out,
                n,
                k,
                w_packed.stride(0),
                x.stride(0),
                scale.stride(0),
                out.stride(0),
                **constexprs(variant),
            )

        launch()
        torch.cuda.synchronize()
        err = (out - ref).abs().max().item()
        ok = torch.allclose(out, ref, rtol=1e-3, atol=1e-2 * ref.abs().max().item())
        ms = triton.testing.do_bench(launch)
        gbs = (w_packed.numel() + x.numel() + scale.numel() * 4 + out.numel() * 4) / ms / 1e6
        print(
            f"WAIT/UNROLL/KEEP={variant} N={n} K={k}: max|err| {err:.3g} ({'OK' if ok else 'MISMATCH'}), "
            f"{ms * 1e3:.1f} us, {gbs:.0f} GB/s"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="check against PyTorch and time on the GPU")
    ap.add_argument("--variants", nargs="+", default=VARIANTS, help="WAIT/UNROLL/KEEP triples")
    ap.add_argument("--context", type=int, default=6, help="SASS lines shown either side of a wgmma mark")
    ap.add_argument("--shape", type=int, nargs=2, default=[4096, 4096], metavar=("N", "K"))
    args = ap.parse_args()
    print(f"Triton {triton.__version__} ({os.path.dirname(triton.__file__)})", file=sys.stderr)
    if args.gpu:
        gpu(*args.shape, args.variants)
    else:
        for variant in args.variants:
            report(variant, args.context)


if __name__ == "__main__":
    main()
