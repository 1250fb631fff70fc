"""The inline PTX of the E2M1 decodes, shared by the Triton (``triton_gemm``) and Gluon kernels.

Each string is the body of an ``inline_asm_elementwise`` call; ``$n`` are its registers, outputs first.
tests/kernels/fp4_prefill/test_fp4_ptx.py runs them through a small emulator of the PTX ops they use.
"""

import triton.language as tl

# Four packed bytes (eight codes) -> low-nibble e4m3 bytes ($0) and high-nibble e4m3 bytes ($1).
E2M1_TO_E4M3_ASM = tl.constexpr("""
{
.reg .b32 t0, t1;
shl.b32 t0, $2, 2;
shl.b32 t1, $2, 4;
and.b32 t0, t0, 0x1C1C1C1C;
and.b32 t1, t1, 0x80808080;
or.b32 $0, t0, t1;
shr.b32 t0, $2, 2;
and.b32 t0, t0, 0x1C1C1C1C;
and.b32 t1, $2, 0x80808080;
or.b32 $1, t0, t1;
}
""")

# Four packed bytes b0..b3 -> fp16 bits of the low nibbles ($0 = b0, b1; $1 = b2, b3) and of the
# high nibbles ($2, $3): each byte is spread to bits 8..15 of a 16-bit lane by prmt, then
# high nibble: (t >> 3) & 0x0E00 | t & 0x8000; low nibble: (t << 1) & 0x0E00 | (t << 4) & 0x8000.
E2M1_TO_F16_ASM = tl.constexpr("""
{
.reg .b32 t, u, v;
prmt.b32 t, $4, 0, 0x1404;
shl.b32 u, t, 1;
shl.b32 v, t, 4;
and.b32 u, u, 0x0E000E00;
and.b32 v, v, 0x80008000;
or.b32 $0, u, v;
shr.b32 u, t, 3;
and.b32 u, u, 0x0E000E00;
and.b32 v, t, 0x80008000;
or.b32 $2, u, v;
prmt.b32 t, $4, 0, 0x3424;
shl.b32 u, t, 1;
shl.b32 v, t, 4;
and.b32 u, u, 0x0E000E00;
and.b32 v, v, 0x80008000;
or.b32 $1, u, v;
shr.b32 u, t, 3;
and.b32 u, u, 0x0E000E00;
and.b32 v, t, 0x80008000;
or.b32 $3, u, v;
}
""")

# Four packed bytes b0..b3 (codes k0..k7, k0 = b0's low nibble) -> the re-based e4m3 bytes of k0..k3 ($0)
# and k4..k7 ($1). $3 / $7 are element 0's pool (bytes 0-3 / 4-7: the e4m3 of magnitudes 0, .5, 1, 1.5 /
# 2, 3, 4, 6 times 2^(1 - d)); the pack's four elements share it ($4-$6, $8-$10 unused). The codes with
# their sign bits cleared are the prmt selectors as they lie (bit 3 clear: no sign-replicate mode); the
# signs, bit 3 or 7 of a byte, meet at bit 7 of a second prmt of the bytes and the bytes shifted by 4.
E2M1_TO_E4M3_LUT_ASM = tl.constexpr("""
{
.reg .b32 m, t, u, v;
and.b32 m, $2, 0x77777777;
shl.b32 t, $2, 4;
prmt.b32 u, $3, $7, m;
prmt.b32 v, t, $2, 0x5140;
and.b32 v, v, 0x80808080;
or.b32 $0, u, v;
shr.b32 m, m, 16;
prmt.b32 u, $3, $7, m;
prmt.b32 v, t, $2, 0x7362;
and.b32 v, v, 0x80808080;
or.b32 $1, u, v;
}
""")

# A re-base distance d ($2, 0..LUT_MAX_D) -> its pool ($0: e4m3 bytes of magnitudes 0, .5, 1, 1.5 times
# 2^(1 - d); $1: of 2, 3, 4, 6), made in registers: f16x2 products with 2^(1 - d) (exact), then the
# hardware's round-to-nearest-even e4m3 conversion, as ``halves``' fp16 path rounds. The lower half of
# each f16x2 becomes the lower byte.
E4M3_POOL_ASM = tl.constexpr("""
{
.reg .b32 f, p0, p1, p2, p3;
.reg .b16 q0, q1, q2, q3;
sub.u32 f, 16, $2;
shl.b32 f, f, 10;
prmt.b32 f, f, f, 0x1010;
mov.b32 p0, 0x38000000;
mov.b32 p1, 0x3E003C00;
mov.b32 p2, 0x42004000;
mov.b32 p3, 0x46004400;
mul.rn.f16x2 p0, p0, f;
mul.rn.f16x2 p1, p1, f;
mul.rn.f16x2 p2, p2, f;
mul.rn.f16x2 p3, p3, f;
cvt.rn.satfinite.e4m3x2.f16x2 q0, p0;
cvt.rn.satfinite.e4m3x2.f16x2 q1, p1;
cvt.rn.satfinite.e4m3x2.f16x2 q2, p2;
cvt.rn.satfinite.e4m3x2.f16x2 q3, p3;
mov.b32 $0, {q0, q1};
mov.b32 $1, {q2, q3};
}
""")
