"""What the Gluon FP4 kernels share: the decode of packed weights to re-based e4m3 words, the tile ids, the
row pointers and the cp.async copies into the rings (module doc of ``gluon_gemm`` for the K order).

Every kernel works in 128-K chunks (``CHUNK``, one activation scale group); a thread handles whole 32-K
scale groups of its weight rows, its 16 packed bytes as four int32 words [BN, 4(q), 4(b)].
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy as cp

from moetune.kernels.fp4_prefill.ptx import E2M1_TO_E4M3_LUT_ASM, E4M3_POOL_ASM

# cp.async global -> shared: async_copy_global_to_shared in Triton 3.6, async_load in later versions
async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # the CTA barrier (renamed after Triton 3.6)
CHUNK = gl.constexpr(128)  # K per wgmma: one activation scale group
# The lut PTX for one packed word per call ($2; pools $3, $4) -> the e4m3 words of k0-3 ($0) and k4-7 ($1).
_LUT_WORD_ASM = gl.constexpr(E2M1_TO_E4M3_LUT_ASM.value.replace("$7", "$4"))


@gluon.constexpr_function
def words_layout(w_smem):
    """The decoded-weight buffer's bytes (``w_smem``, e4m3 [BN, 128]) as int32 words [BN, 32]: a 128-byte row
    either way, so the same swizzle."""
    return gl.NVMMASharedLayout(swizzle_byte_width=w_smem.swizzle_byte_width, element_bitwidth=32, rank=2)


@gluon.jit
def decode_words(words, s, rmax, BN: gl.constexpr):
    """Packed words [BN, 4(q), 4(b)] (real K order), their group scales s [BN, 4] and the row's largest
    scale rmax [BN, 1] -> the re-based e4m3 words [BN, q, b, h] (4 weights each, h: the word's K half)."""
    d = gl.minimum(rmax - s, 15)
    lo, hi = gl.inline_asm_elementwise(E4M3_POOL_ASM, "=r,=r,r", [d], dtype=(gl.int32, gl.int32),
                                       is_pure=True, pack=1)
    lo = gl.expand_dims(lo, 2).broadcast_to([BN, 4, 4])
    hi = gl.expand_dims(hi, 2).broadcast_to([BN, 4, 4])
    first, second = gl.inline_asm_elementwise(_LUT_WORD_ASM, "=r,=r,r,r,r", [words, lo, hi],
                                              dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    return gl.join(first, second)


@gluon.jit
def store_words(dst, words, W_WORDS: gl.constexpr, BN: gl.constexpr):
    """Decoded words [BN, q, b, h] into a [BN, 128] e4m3 buffer in logical K order: word (q, b, h) holds
    logical K 32b + 16h + 4q .. + 3, word column 8b + 4h + q."""
    flat = gl.reshape(words.permute((0, 2, 3, 1)), [BN, 32])
    _as_words(dst, W_WORDS, BN).store(flat)


# the same shared bytes under another type: `_reinterpret` in Triton 3.6, `reinterpret` in later versions
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def _as_words(buf, W_WORDS: gl.constexpr, BN: gl.constexpr):
        return buf.reinterpret(gl.int32, [BN, 32], W_WORDS)
else:
    @gluon.jit
    def _as_words(buf, W_WORDS: gl.constexpr, BN: gl.constexpr):
        return buf._reinterpret(gl.int32, [BN, 32], W_WORDS)


@gluon.jit
def n_tiles(N, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """N tiles of BN: N / BN, or with a tail tile (EVEN_N False) one more."""
    if EVEN_N:
        tiles = N // BN
    else:
        tiles = (N + BN - 1) // BN
    return tiles


@gluon.jit
def tile_of(t, N, num_blocks, GROUP_SIZE_M, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """Tile t's (M-block, N-tile): GROUP_SIZE_M M-blocks a group, N-tiles within it."""
    num_pid_n = n_tiles(N, BN, EVEN_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (t // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = gl.minimum(num_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((t % num_pid_in_group) % group_size_m)
    pid_n = (t % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@gluon.jit
def tile_ids(N, num_blocks, GROUP_SIZE_M, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """This program's (M-block, N-tile)."""
    return tile_of(gl.program_id(0), N, num_blocks, GROUP_SIZE_M, BN, EVEN_N)


@gluon.jit
def tile_rows(pid_n, N, L: gl.constexpr, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """The N tile's weight rows in L. In a tail tile (EVEN_N False) rows past N read row N - 1 again: the
    copies stay in bounds and unmasked, and the epilogue stores no column past N (``store_mask``)."""
    n = pid_n * BN + gl.arange(0, BN, L)
    if not EVEN_N:
        n = gl.minimum(n, N - 1)
    return n


@gluon.jit
def store_mask(n_c, N, row_ok, EVEN_N: gl.constexpr, N_FIRST: gl.constexpr = False):
    """The epilogue's store mask: the rows of routes (``row_ok``), in a tail tile only columns < N. N_FIRST:
    the tile is [N, M] (SWAP_AB 1), else [M, N]."""
    if N_FIRST:
        mask = row_ok[None, :]
        if not EVEN_N:
            mask = mask & (n_c < N)[:, None]
    else:
        mask = row_ok[:, None]
        if not EVEN_N:
            mask = mask & (n_c < N)[None, :]
    return mask


@gluon.jit
def weight_rows(w_ptr, w_scale_ptr, expert, pid_n, N, stride_we, stride_wn, stride_wse, stride_wsn,
                P_W: gl.constexpr, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """The N tile's chunk-0 pointers: packed words [BN, 4(q), 4(b)] in P_W, group scales [BN, 4(q)]
    (``tile_rows``: a tail tile's rows past N repeat row N - 1)."""
    S2: gl.constexpr = gl.SliceLayout(2, P_W)
    n_w = tile_rows(pid_n, N, gl.SliceLayout(1, gl.SliceLayout(2, P_W)), BN, EVEN_N)
    q_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, P_W)))
    b_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, P_W)))
    w_rows = (w_ptr + expert * stride_we + gl.expand_dims(gl.expand_dims(n_w.to(gl.int64) * stride_wn, 1), 2)
              + gl.expand_dims(gl.expand_dims(q_w * 4, 0), 2) + gl.expand_dims(gl.expand_dims(b_w, 0), 1))
    return w_rows, _scale_rows(w_scale_ptr, expert, pid_n, N, stride_wse, stride_wsn, S2, BN, EVEN_N)


@gluon.jit
def _scale_rows(w_scale_ptr, expert, pid_n, N, stride_wse, stride_wsn, S2: gl.constexpr, BN: gl.constexpr,
                EVEN_N: gl.constexpr):
    """The N tile's chunk-0 group scale pointers [BN, 4(q)] in S2."""
    n_g = tile_rows(pid_n, N, gl.SliceLayout(1, S2), BN, EVEN_N)
    return (w_scale_ptr + expert * stride_wse + gl.expand_dims(n_g.to(gl.int64) * stride_wsn, 1)
            + gl.expand_dims(gl.arange(0, 4, gl.SliceLayout(0, S2)), 0))


@gluon.jit
def row_max_scale(ws_rows, num_k, S2: gl.constexpr, BN: gl.constexpr):
    """The largest scale code of each weight row [BN, 1], eight loads in flight at a time."""
    smax = gl.zeros([BN, 4], gl.int32, S2)
    for k0 in range(0, num_k, 8):
        for u in gl.static_range(8):
            s = gl.load(ws_rows + gl.minimum(k0 + u, num_k - 1) * (CHUNK // 32))
            smax = gl.maximum(smax, s.to(gl.int32))
    return gl.expand_dims(gl.max(smax, axis=1), 1)


@gluon.jit
def tile_row_max(ws_rows, smax_rows, pid_n, N, num_k, S2: gl.constexpr, BN: gl.constexpr,
                 EVEN_N: gl.constexpr, HAS_SMAX: gl.constexpr):
    """The N tile's largest scale code a row [BN, 1] in S2: one load of the maxima stored with the weights
    (HAS_SMAX: ``smax_rows`` points at the expert's row of ``w_smax [E, N]``,
    ``moetune.quant.scale_row_max``), else a pass over the tile's scale rows (``row_max_scale``)."""
    if HAS_SMAX:
        n = tile_rows(pid_n, N, gl.SliceLayout(1, S2), BN, EVEN_N)
        rmax = gl.expand_dims(gl.load(smax_rows + n).to(gl.int32), 1)
    else:
        rmax = row_max_scale(ws_rows, num_k, S2, BN)
    return rmax


@gluon.jit
def x_slot(x_buf, c, k, NBUF: gl.constexpr, A_RESIDENT: gl.constexpr):
    """The activation buffer of chunk c (k within its tile): the ring's slot, or the resident chunk k."""
    slot = c % NBUF
    if A_RESIDENT:
        slot = k
    return x_buf.index(slot)


@gluon.jit
def x_copy(x_buf, c, k, x_rows, cols_x, row_ok_x, fresh, NBUF: gl.constexpr, A_RESIDENT: gl.constexpr):
    """Chunk k's activations into their buffer; resident ones only for a tile of a new M-block (``fresh``):
    a masked copy would still write the buffer (zeros)."""
    if A_RESIDENT:
        if fresh:
            async_load(x_buf.index(k), x_rows + k * CHUNK + cols_x[None, :], mask=row_ok_x[:, None])
    else:
        async_load(x_buf.index(c % NBUF), x_rows + k * CHUNK + cols_x[None, :], mask=row_ok_x[:, None])


@gluon.jit
def fill_ring(x_ring, w_ring, xs_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s, fresh,
              RING: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr):
    """The copies of chunks 0 .. RING - 2, one commit group each (resident activations: only if ``fresh``).
    Past the last chunk (K / 128 < RING - 1; K / 128 >= 2 always) the last chunk again, never used, as in
    the loop: a masked copy would cost instructions in every loop trip, and chunks 0 and 1 keep their
    constant offsets unclamped."""
    for i in gl.static_range(RING - 1):
        kc = i
        live = fresh
        if i >= 2:
            kc = gl.minimum(i, num_k - 1)
            live = fresh & (i < num_k)
        x_copy(x_ring, i, kc, x_rows, cols_x, row_ok_x, live, RING, A_RESIDENT)
        async_load(w_ring.index(i), w_rows + kc * (CHUNK // 8))
        if SCALE_RING:
            async_load(xs_ring.index(i), xs_src + kc, mask=row_ok_s)
        cp.commit_group()
