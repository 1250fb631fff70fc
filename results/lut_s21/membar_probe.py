"""Offline (no GPU): the CTA barriers Triton's membar analysis puts in a two-slot ring's loop when the slot's
data comes by TMA with an mbarrier wait, against cp.async with a wait_group. Run from the repository root
with the Triton the GPU runs first on the path:

    PYTHONPATH=/tmp/t36:. python results/lut_s21/membar_probe.py

Session 21 (Triton 3.6): the TMA loop carries 3 BAR.SYNC, the cp.async loop 2, so a TMA weight ring would
not take the Gluon FP4 kernel's barriers away (results/fp4_prefill.md)."""

import collections
import inspect
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

sys.path.insert(0, "benchmarks")
from fp4_sm90_resources import k_loop  # noqa: E402

_async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
L = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0]))


@gluon.jit
def tma_ring(w_ptr, out_ptr, R, C, n, BN: gl.constexpr, BC: gl.constexpr):
    S: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    desc = tma.make_tensor_descriptor(w_ptr, shape=[R, C], strides=[C, 1], block_shape=[BN, BC], layout=S)
    smem = gl.allocate_shared_memory(gl.int8, [2, BN, BC], S)
    bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    mbarrier.init(bar.index(1), count=1)
    acc = gl.zeros([BN, BC], gl.int32, L)
    for i in range(n):
        mbarrier.expect(bar.index(i % 2), BN * BC)
        _tma_load(desc, [gl.program_id(0) * BN, i * BC], bar.index(i % 2), smem.index(i % 2))
        mbarrier.wait(bar.index(i % 2), (i // 2) & 1)
        acc += smem.index(i % 2).load(L).to(gl.int32)
    rows = gl.arange(0, BN, gl.SliceLayout(1, L))
    cols = gl.arange(0, BC, gl.SliceLayout(0, L))
    gl.store(out_ptr + rows[:, None] * BC + cols[None, :], acc)


@gluon.jit
def cp_ring(w_ptr, out_ptr, R, C, n, BN: gl.constexpr, BC: gl.constexpr):
    smem = gl.allocate_shared_memory(gl.int8, [2, BN, BC], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    acc = gl.zeros([BN, BC], gl.int32, L)
    rows = gl.arange(0, BN, gl.SliceLayout(1, L))
    cols = gl.arange(0, BC, gl.SliceLayout(0, L))
    for i in range(n):
        src = w_ptr + (gl.program_id(0) * BN + rows[:, None]) * C + i * BC + cols[None, :]
        _async_load(smem.index(i % 2), src)
        cp.commit_group()
        cp.wait_group(0)
        acc += smem.index(i % 2).load(L).to(gl.int32)
    gl.store(out_ptr + rows[:, None] * BC + cols[None, :], acc)


def loop_ops(fn) -> dict:
    params = list(inspect.signature(fn.fn).parameters)
    const = {"BN": 64, "BC": 64}
    types = {"w_ptr": "*i8", "out_ptr": "*i32"}
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    aligned = {(params.index(k),): [["tt.divisibility", 16]] for k in ("w_ptr", "out_ptr", "C")}
    src = GluonASTSource(fn, sig, constexprs={(params.index(k),): v for k, v in const.items()}, attrs=aligned)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    return dict(collections.Counter(op for op in k_loop(sass) if op in ("BAR", "SYNCS", "UTMALDG", "LDGSTS")))


if __name__ == "__main__":
    print(f"Triton {triton.__version__}")
    for fn in (tma_ring, cp_ring):
        print(fn.fn.__name__, loop_ops(fn))
