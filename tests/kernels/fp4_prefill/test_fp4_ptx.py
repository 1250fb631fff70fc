"""The inline-PTX E2M1 decodes, executed by a tiny emulator of the PTX ops they use.

The interpreter runs the Triton twins of these strings, so without this the PTX itself would be
checked only on the GPU. Registers follow ``inline_asm_elementwise`` with pack=4: the outputs
first (two 32-bit registers per 4-element output of 16-bit type, one per 8-bit type), then the
input register holding bytes b0..b3 (b0 lowest).
"""

import re
import struct

import numpy as np
import torch

from moetune.kernels.fp4_prefill.ptx import (
    E2M1_TO_E4M3_ASM,
    E2M1_TO_E4M3_LUT_ASM,
    E2M1_TO_F16_ASM,
    E4M3_POOL_ASM,
)
from moetune.kernels.fp4_prefill.triton_gemm import e4m3_pools
from moetune.quant.mxfp4 import E2M1_VALUES

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, sel: int) -> int:
    src = (b << 32) | a
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _halves(x: int) -> list[int]:
    return [x & 0xFFFF, x >> 16]


def _mul_f16x2(a: int, b: int) -> int:
    """mul.rn.f16x2: each 16-bit lane an IEEE half product, rounded to nearest even (numpy's float16)."""
    x, y = (np.array(_halves(v), dtype=np.uint16).view(np.float16) for v in (a, b))
    lo, hi = (x * y).astype(np.float16).view(np.uint16).tolist()
    return lo | hi << 16


def _cvt_e4m3x2(a: int) -> int:
    """cvt.rn.satfinite.e4m3x2.f16x2: the lower lane to the lower byte (torch's round-to-nearest-even
    e4m3 cast of the exact half values; the values here never need the saturation)."""
    lanes = torch.from_numpy(np.array(_halves(a), dtype=np.uint16).view(np.float16).astype(np.float32))
    lo, hi = lanes.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    return lo | hi << 8


def _run(ptx: str, regs: dict[str, int]) -> dict[str, int]:
    ops = {"shl.b32": lambda x, y: (x << y) & M32, "shr.b32": lambda x, y: x >> y,
           "and.b32": lambda x, y: x & y, "or.b32": lambda x, y: x | y, "sub.u32": lambda x, y: (x - y) & M32,
           "mov.b32": lambda x: x, "mul.rn.f16x2": _mul_f16x2, "cvt.rn.satfinite.e4m3x2.f16x2": _cvt_e4m3x2}
    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b32" and "{" in args:  # packing two 16-bit registers, the first the lower half
            dst, pair = args.split(",", 1)
            lo, hi = (regs[r.strip()] for r in pair.strip(" {}").split(","))
            regs[dst.strip()] = lo | hi << 16
            continue
        dst, *src = [a.strip() for a in args.split(",")]
        vals = [int(s, 0) if re.fullmatch(r"0x[0-9A-Fa-f]+|\d+", s) else regs[s] for s in src]
        if op == "prmt.b32":
            regs[dst] = _prmt(*vals)
        else:
            assert op in ops, op
            regs[dst] = ops[op](*vals)
    return regs


def _f16(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits))[0]


def _e2m1(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7]


def _e4m3(byte: int) -> float:
    sign, exp, man = -1.0 if byte & 0x80 else 1.0, (byte >> 3) & 15, byte & 7
    return sign * (man / 8 * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def test_f16_ptx_decodes_every_byte():
    """Four bytes per register: $0/$1 = low nibbles of b0,b1 / b2,b3, $2/$3 = high nibbles, f16x2."""
    for start in range(0, 256, 4):
        packed = [(start + i * 67) % 256 for i in range(4)]  # every byte value appears in every lane
        out = _run(E2M1_TO_F16_ASM.value, {"$4": int.from_bytes(bytes(packed), "little")})
        lo = [_f16(out[r] >> s & 0xFFFF) for r in ("$0", "$1") for s in (0, 16)]
        hi = [_f16(out[r] >> s & 0xFFFF) for r in ("$2", "$3") for s in (0, 16)]
        assert lo == [_e2m1(b & 15) * 2.0 ** -14 for b in packed]
        assert hi == [_e2m1(b >> 4) * 2.0 ** -14 for b in packed]


def test_e4m3_ptx_decodes_every_byte():
    for start in range(0, 256, 4):
        packed = [(start + i * 67) % 256 for i in range(4)]
        out = _run(E2M1_TO_E4M3_ASM.value, {"$2": int.from_bytes(bytes(packed), "little")})
        assert [_e4m3(out["$0"] >> 8 * i & 0xFF) for i in range(4)] == [_e2m1(b & 15) / 64 for b in packed]
        assert [_e4m3(out["$1"] >> 8 * i & 0xFF) for i in range(4)] == [_e2m1(b >> 4) / 64 for b in packed]


def test_lut_ptx_looks_up_every_code_at_every_rebase_distance():
    """$0/$1 = e4m3 of codes k0..k3 / k4..k7 (k0 = b0's low nibble) re-based by 2^(1 - d), from the pool
    in $3/$7 (the other elements' pool registers hold garbage: only element 0's may be read)."""
    pools = e4m3_pools(torch.device("cpu")).tolist()
    for d, (lo_pool, hi_pool) in enumerate(pools):
        want = torch.tensor(E2M1_VALUES) * 2.0 ** (1 - d)
        want = torch.cat([want, -want]).to(torch.float8_e4m3fn).float().tolist()  # code order 0..15
        for start in range(0, 256, 4):
            packed = [(start + i * 67) % 256 for i in range(4)]
            codes = [c for b in packed for c in (b & 15, b >> 4)]
            regs = {"$2": int.from_bytes(bytes(packed), "little"), "$3": lo_pool & M32, "$7": hi_pool & M32,
                    **{f"${r}": 0xDEADBEEF for r in (4, 5, 6, 8, 9, 10)}}
            out = _run(E2M1_TO_E4M3_LUT_ASM.value, regs)
            got = [_e4m3(out[r] >> 8 * i & 0xFF) for r in ("$0", "$1") for i in range(4)]
            assert got == [want[c] for c in codes]
            signs = [out[r] >> 8 * i & 0x80 for r in ("$0", "$1") for i in range(4)]
            assert signs == [(c & 8) << 4 for c in codes]


def test_pool_ptx_makes_the_interpreters_table_at_every_rebase_distance():
    """The GPU makes lut's pools in registers (f16x2 products, RNE e4m3 conversion); the interpreter reads
    ``e4m3_pools``. Both must give the same bytes, the subnormal and zero pools included."""
    for d, (lo, hi) in enumerate(e4m3_pools(torch.device("cpu")).tolist()):
        out = _run(E4M3_POOL_ASM.value, {"$2": d})
        assert (out["$0"], out["$1"]) == (lo & M32, hi & M32), d
