"""The warp-specialized Gluon kernel (``DECODE_WARPS`` 4 or 8, SWAP_AB 0: ``fp4_wgmma_ws_kernel``).

Persistent, one program an SM: a partition of DECODE_WARPS warps copies and decodes (``_ws_decode``) for
the MMA warps (``_ws_mma``), and they meet on mbarriers a slot instead of CTA barriers, so the decode runs
ahead into the next tile while the MMA warps finish this one. Only this kernel is persistent: persistent
versions of the plain loops were slower (docs/kernels/fp4_prefill.md, DECODE_WARPS).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moetune.kernels.fp4_prefill.gluon_common import (
    CHUNK,
    async_load,
    barrier,
    decode_words,
    n_tiles,
    store_mask,
    store_words,
    tile_of,
    tile_row_max,
    weight_rows,
    words_layout,
    x_copy,
    x_slot,
)


@gluon.jit
def _ws_tile(t, N, blocks, GROUP_SIZE_M, expert_ids_ptr, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """Tile t of a persistent program: its (M-block, N-tile) and expert (int32: nothing waits for the load
    until the expert is used)."""
    pid_m, pid_n = tile_of(t, N, blocks, GROUP_SIZE_M, BN, EVEN_N)
    return pid_m, pid_n, gl.load(expert_ids_ptr + pid_m)


@gluon.jit
def _ws_range(num_tiles, A_RESIDENT: gl.constexpr):
    """A persistent program's tiles as (first, stop, step): every grid-th tile, or with A_RESIDENT an equal
    run of consecutive ones (an M-block's N tiles in a row, so its activations are copied once)."""
    pid = gl.program_id(0)
    grid = gl.num_programs(0)
    first, stop, step = pid, num_tiles, grid
    if A_RESIDENT:
        first, stop, step = pid * num_tiles // grid, (pid + 1) * num_tiles // grid, 1
    return first, stop, step


@gluon.jit
def _ws_routes(pid_m, sorted_ids_ptr, ROWS: gl.constexpr, BM: gl.constexpr):
    """The M-block's route ids (padding: ``routes``) in ROWS."""
    return gl.load(sorted_ids_ptr + pid_m * BM + gl.arange(0, BM, ROWS))


@gluon.jit
def _ws_row_ptrs(route, pid_m, base, routes, stride, A_DIV: gl.constexpr, GATHERED: gl.constexpr,
                 ROWS: gl.constexpr, BM: gl.constexpr):
    """Pointers to the activation (or activation-scale) rows of an M-block's routes (padding: row 0)."""
    if GATHERED:  # rows copied into slot order beforehand
        row = pid_m * BM + gl.arange(0, BM, ROWS)
    else:
        row = gl.where(route < routes, route // A_DIV, 0)
    return base + row.to(gl.int64) * stride


# the packed-weight tiles of W_TMA: [1, BN, 16] int32 words, row-major (the launcher's descriptor's layout)
W_TILE = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3))
# TMA global -> shared: async_copy_global_to_shared in Triton 3.6, async_load in later versions
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _w_copy(w_ring, w_full, w_src, c, k, expert, pid_n, LOOK: gl.constexpr, BN: gl.constexpr,
            W_TMA: gl.constexpr):
    """Chunk k's packed weights (chunk c of the program) into its ring slot: a TMA copy of the [1, BN, 16]
    word tile from the descriptor ``w_src`` (rows past N zero-filled; ``w_full`` counts its bytes), or this
    partition's cp.async copies from the row pointers ``w_src`` (16 bytes a thread)."""
    if W_TMA:
        mbarrier.expect(w_full.index(c % LOOK), BN * CHUNK // 2)
        _tma_load(w_src, [expert, pid_n * BN, k * (CHUNK // 8)], w_full.index(c % LOOK),
                  w_ring.index(c % LOOK))
    else:
        async_load(w_ring.index(c % LOOK), w_src + k * (CHUNK // 8))


@gluon.jit
def _w_words(w_ring, w_full, c, P_W: gl.constexpr, LOOK: gl.constexpr, BN: gl.constexpr,
             W_TMA: gl.constexpr):
    """Chunk c's packed words [BN, 4(q), 4(b)] from its ring slot, once they are in (TMA: its barrier; the
    cp.async copies: the caller's wait)."""
    slot = w_ring.index(c % LOOK)
    if W_TMA:
        mbarrier.wait(w_full.index(c % LOOK), (c // LOOK) & 1)
        slot = _as_rows(slot, BN)
    return slot.load(P_W)


# a TMA tile [1, BN, 16] (no swizzle: row-major words) read as [BN, 4, 4]: `_reinterpret` in Triton 3.6
if hasattr(gl.shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def _as_rows(buf, BN: gl.constexpr):
        return buf.reinterpret(gl.int32, [BN, 4, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
else:
    @gluon.jit
    def _as_rows(buf, BN: gl.constexpr):
        return buf._reinterpret(gl.int32, [BN, 4, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))


@gluon.jit
def _ws_mma(x_buf, dec, rbuf, out_smem, ready, empty, a_scale_ptr, c_ptr, sorted_ids_ptr, num_tiles, blocks,
            N, K, routes, GROUP_SIZE_M, stride_asm, stride_cm, A_DIV: gl.constexpr,
            GATHERED: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
            A_RESIDENT: gl.constexpr, EVEN_N: gl.constexpr, num_warps: gl.constexpr):
    """DECODE_WARPS' default partition (BM / 16 warps), over the program's tiles: each chunk's wgmma once its
    activations and decoded weights are in (``ready``), the slot given back (``empty``) as soon as the
    product is waited for, then the rescale; each tile's epilogue while the decode partition goes on into
    the next tile. Route ids are loaded two tiles ahead, so no tile start waits for memory."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BN, 32])
    ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    VEC: gl.constexpr = 128 // c_ptr.dtype.element_ty.primitive_bitwidth  # 16 bytes a thread
    OUT_COLS: gl.constexpr = min(32, BN // VEC)  # lanes along a row
    OUT_L: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // OUT_COLS, OUT_COLS], [num_warps, 1], [1, 0])
    num_k = K // CHUNK
    first, stop, step = _ws_range(num_tiles, A_RESIDENT)
    pid_m, pid_n = tile_of(first, N, blocks, GROUP_SIZE_M, BN, EVEN_N)
    route = _ws_routes(pid_m, sorted_ids_ptr, ROWS, BM)
    xs_src = _ws_row_ptrs(route, pid_m, a_scale_ptr, routes, stride_asm, A_DIV, GATHERED, ROWS, BM)
    xs = gl.load(xs_src, mask=route < routes, other=0.0)
    pid_m_n, pid_n_n = tile_of(gl.minimum(first + step, num_tiles - 1), N, blocks, GROUP_SIZE_M, BN,
                               EVEN_N)
    route_n = _ws_routes(pid_m_n, sorted_ids_ptr, ROWS, BM)
    zero = gl.zeros([BM, BN], gl.float32, MMA)
    rmax = gl.zeros([BN], gl.int32, gl.SliceLayout(0, MMA))
    g = 0
    ti = 0
    for t in range(first, stop, step):
        # (past the last tile: a real one, never stored)
        pid_m_nn, pid_n_nn = tile_of(gl.minimum(t + 2 * step, num_tiles - 1), N, blocks, GROUP_SIZE_M, BN,
                                     EVEN_N)
        route_nn = _ws_routes(pid_m_nn, sorted_ids_ptr, ROWS, BM)  # used a tile from now
        xs_src_n = _ws_row_ptrs(route_n, pid_m_n, a_scale_ptr, routes, stride_asm, A_DIV, GATHERED, ROWS,
                                BM)
        acc = zero
        for k in range(num_k):
            c = g + k
            mbarrier.wait(ready.index(c % NBUF), (c // NBUF) & 1)
            part = warpgroup_mma(x_slot(x_buf, c, k, NBUF, A_RESIDENT), dec.index(c % NBUF).permute((1, 0)),
                                 zero, use_acc=False, is_async=True)
            if k == 0:  # this tile's row max scales, written by the decode partition before its first ready
                rmax = rbuf.index(ti % 2).load(gl.SliceLayout(0, MMA))
            last = k + 1 == num_k
            xs_next = gl.load(gl.where(last, xs_src_n, xs_src + k + 1),
                              mask=gl.where(last, route_n, route) < routes, other=0.0)
            part = warpgroup_mma_wait(num_outstanding=0, deps=[part])
            barrier()  # the MMA warpgroups' products (the arrive is one thread's)
            mbarrier.arrive(empty.index(c % NBUF), count=1)
            acc += part * xs[:, None]
            xs = xs_next
        wf = ((rmax - 1) << 23).to(gl.float32, bitcast=True)  # 2^(rmax - 128)
        # through shared memory, so each warp stores whole rows (16 B a thread) instead of 32-byte pieces
        # of eight rows (a warp's next read of out_smem is past this tile's chunk barriers)
        out_smem.store((acc * wf[None, :]).to(c_ptr.dtype.element_ty))
        barrier()
        n_c = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(0, OUT_L))
        row = gl.convert_layout(route, gl.SliceLayout(1, OUT_L))
        c_ptrs = c_ptr + row.to(gl.int64)[:, None] * stride_cm + n_c[None, :]
        gl.store(c_ptrs, out_smem.load(OUT_L), mask=store_mask(n_c, N, row < routes, EVEN_N))
        pid_m_n, pid_n, pid_n_n = pid_m_nn, pid_n_n, pid_n_nn
        route, route_n = route_n, route_nn
        xs_src = xs_src_n
        g += num_k
        ti += 1


@gluon.jit
def _ws_decode(x_buf, w_ring, w_full, dec, rbuf, ready, empty, a_ptr, w_ptr, w_desc, w_scale_ptr, w_smax_ptr,
               sorted_ids_ptr, expert_ids_ptr, num_tiles, blocks, N, K, routes, GROUP_SIZE_M, stride_am,
               stride_we, stride_wn, stride_wse, stride_wsn, stride_wsme, A_DIV: gl.constexpr,
               GATHERED: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
               LOOK: gl.constexpr, DW: gl.constexpr, A_RESIDENT: gl.constexpr, EVEN_N: gl.constexpr,
               HAS_SMAX: gl.constexpr, W_TMA: gl.constexpr):
    """DECODE_WARPS' worker partition (DW warps), over the program's tiles: copies (activations into the
    shared slots, packed weights into its own ring, LOOK chunks ahead within a tile, each slot taken once
    ``empty`` says its last product is done), the tile's row max scales into ``rbuf`` (loaded while its
    first copies fly), and the decode of each chunk into the slot's weight buffer, then ``ready``. It runs up
    to NBUF chunks ahead of the MMA warps. The next tile's expert and route ids are loaded a tile ahead.
    W_TMA: the packed weights by TMA copies (``w_desc``), which take none of the partition's issue slots."""
    P_W: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [DW, 1, 1], [2, 1, 0])
    S2: gl.constexpr = gl.SliceLayout(2, P_W)
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [DW, 1], [1, 0])
    X_ROWS: gl.constexpr = gl.SliceLayout(1, X_LOAD)
    R_L: gl.constexpr = gl.BlockedLayout([1], [32], [DW], [0])
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, CHUNK], gl.float8e4nv)
    W_WORDS: gl.constexpr = words_layout(W_SMEM)
    cols_x = gl.arange(0, CHUNK, gl.SliceLayout(0, X_LOAD))
    num_k = K // CHUNK
    first, stop, step = _ws_range(num_tiles, A_RESIDENT)
    pid_m, pid_n, expert = _ws_tile(first, N, blocks, GROUP_SIZE_M, expert_ids_ptr, BN, EVEN_N)
    route = _ws_routes(pid_m, sorted_ids_ptr, X_ROWS, BM)
    g = 0
    ti = 0
    held = -1  # the M-block whose activations are resident
    for t in range(first, stop, step):
        pid_m_n, pid_n_n, expert_n = _ws_tile(gl.minimum(t + step, num_tiles - 1), N, blocks, GROUP_SIZE_M,
                                              expert_ids_ptr, BN, EVEN_N)
        route_n = _ws_routes(pid_m_n, sorted_ids_ptr, X_ROWS, BM)  # used a tile from now
        w_rows, ws_rows = weight_rows(w_ptr, w_scale_ptr, expert.to(gl.int64), pid_n, N, stride_we, stride_wn,
                                      stride_wse, stride_wsn, P_W, BN, EVEN_N)
        if W_TMA:
            w_src = w_desc
        else:
            w_src = w_rows
        x_rows = _ws_row_ptrs(route, pid_m, a_ptr, routes, stride_am, A_DIV, GATHERED, X_ROWS, BM)[:, None]
        row_ok_x = route < routes
        fresh = pid_m != held
        held = pid_m
        for i in gl.static_range(LOOK):
            c = g + i
            # the slot's last product done (resident: chunk i of the last tile too, as NBUF <= num_k)
            mbarrier.wait(empty.index(c % NBUF), ((c // NBUF) & 1) ^ 1)
            kn = gl.minimum(i, num_k - 1)
            x_copy(x_buf, c, kn, x_rows, cols_x, row_ok_x, fresh, NBUF, A_RESIDENT)
            _w_copy(w_ring, w_full, w_src, c, kn, expert, pid_n, LOOK, BN, W_TMA)
            cp.commit_group()
        # the resident tile (down's K of 1024, 8 chunks a tile) was 3-5% faster with the pass than with
        # the stored maxima on the H200, the others 6% slower (docs/kernels/fp4_prefill.md, row maxima)
        rmax = tile_row_max(ws_rows, w_smax_ptr + expert * stride_wsme, pid_n, N, num_k, S2, BN, EVEN_N,
                            HAS_SMAX and not A_RESIDENT)
        rbuf.index(ti % 2).store(gl.convert_layout(gl.reshape(rmax, [BN]), R_L))
        s = gl.load(ws_rows).to(gl.int32)
        for k in range(num_k):
            c = g + k
            cp.wait_group(LOOK - 1)  # chunk k (mine)
            words = _w_words(w_ring, w_full, c, P_W, LOOK, BN, W_TMA)
            s_next = gl.load(ws_rows + gl.minimum(k + 1, num_k - 1) * (CHUNK // 32)).to(gl.int32)
            store_words(dec.index(c % NBUF), decode_words(words, s, rmax, BN), W_WORDS, BN)
            fence_async_shared()
            barrier()  # the partition's copies landed and decodes stored (the arrive is one thread's)
            mbarrier.arrive(ready.index(c % NBUF), count=1)
            if k + LOOK < num_k:  # the copies of chunk k + LOOK of this tile
                cn = c + LOOK
                mbarrier.wait(empty.index(cn % NBUF), ((cn // NBUF) & 1) ^ 1)
                x_copy(x_buf, cn, k + LOOK, x_rows, cols_x, row_ok_x, fresh, NBUF, A_RESIDENT)
                _w_copy(w_ring, w_full, w_src, cn, k + LOOK, expert, pid_n, LOOK, BN, W_TMA)
            cp.commit_group()  # (empty past the tile's last chunk: the wait above counts groups)
            s = s_next
        pid_m, pid_n, expert, route = pid_m_n, pid_n_n, expert_n, route_n
        g += num_k
        ti += 1
    cp.wait_group(0)


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_ws_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_smax_ptr, c_ptr, sorted_ids_ptr,
                        expert_ids_ptr, num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm,
                        stride_we, stride_wn, stride_wse, stride_wsn, stride_wsme, stride_cm, GROUP_SIZE_M,
                        A_DIV: gl.constexpr,
                        GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                        RING: gl.constexpr, DECODE_WARPS: gl.constexpr, DECODE_REGS: gl.constexpr,
                        A_RESIDENT: gl.constexpr, X_SLOTS: gl.constexpr, num_warps: gl.constexpr,
                        EVEN_N: gl.constexpr = True, HAS_SMAX: gl.constexpr = False,
                        W_TMA: gl.constexpr = False, w_desc=None):
    """SWAP_AB 0, ``DECODE_WARPS`` 4 or 8: persistent and warp-specialized. That many warps copy and decode
    (DECODE_REGS registers a thread), the kernel's num_warps (BM / 16) multiply, rescale and store; they meet
    on mbarriers a slot (``ready``: activations and decoded weights in; ``empty``: the product done) instead
    of CTA barriers, and each program (one an SM) takes every grid-th tile, the decode running ahead into the
    next tile while the MMA warps finish this one. RING slots (num_stages + 1) of activations and decoded
    weights; packed weights copied num_stages chunks ahead within a tile.

    ``A_RESIDENT``: X_SLOTS = K / 128 activation chunks, the whole M-block, stay in shared memory while the
    program runs through consecutive tiles; they are copied again only when the M-block changes (each chunk
    once its last product is done, which the ring's ``empty`` already says), instead of once a tile."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    blocks = gl.load(num_padded_ptr) // BM
    num_tiles = blocks * n_tiles(N, BN, EVEN_N)
    first, stop, step = _ws_range(num_tiles, A_RESIDENT)
    if first >= stop:
        return
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, CHUNK], gl.float8e4nv)
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, CHUNK], gl.float8e4nv)
    x_buf = gl.allocate_shared_memory(gl.float8e4nv, [X_SLOTS, BM, CHUNK], X_SMEM)
    dec = gl.allocate_shared_memory(gl.float8e4nv, [RING, BN, CHUNK], W_SMEM)
    if W_TMA:  # the descriptor's [1, BN, 16] word tiles, unswizzled
        w_ring = gl.allocate_shared_memory(gl.int32, [RING - 1, 1, BN, CHUNK // 8], W_TILE)
    else:
        w_ring = gl.allocate_shared_memory(gl.int32, [RING - 1, BN, 4, 4],
                                           gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    w_full = gl.allocate_shared_memory(gl.int64, [RING - 1, 1], mbarrier.MBarrierLayout())
    rbuf = gl.allocate_shared_memory(gl.int32, [2, BN], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # the epilogue's tile: 16-byte pieces XOR-swizzled over 8 rows, so that both the accumulator's stores
    # (8 rows a warp) and the row-wise loads are free of bank conflicts
    VEC: gl.constexpr = 128 // c_ptr.dtype.element_ty.primitive_bitwidth
    out_smem = gl.allocate_shared_memory(c_ptr.dtype.element_ty, [BM, BN],
                                         gl.SwizzledSharedLayout(VEC, 1, 8, [1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(RING):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(RING - 1):
        mbarrier.init(w_full.index(i), count=1)
    barrier()
    gl.warp_specialize([
        (_ws_mma, (x_buf, dec, rbuf, out_smem, ready, empty, a_scale_ptr, c_ptr, sorted_ids_ptr, num_tiles,
                   blocks, N, K, routes, GROUP_SIZE_M, stride_asm, stride_cm, A_DIV, GATHERED, BM,
                   BN, RING, A_RESIDENT, EVEN_N, num_warps)),
        (_ws_decode, (x_buf, w_ring, w_full, dec, rbuf, ready, empty, a_ptr, w_ptr, w_desc, w_scale_ptr,
                      w_smax_ptr, sorted_ids_ptr,
                      expert_ids_ptr, num_tiles, blocks, N, K, routes, GROUP_SIZE_M, stride_am, stride_we,
                      stride_wn, stride_wse, stride_wsn, stride_wsme, A_DIV, GATHERED, BM, BN, RING,
                      RING - 1, DECODE_WARPS, A_RESIDENT, EVEN_N, HAS_SMAX, W_TMA)),
    ], [DECODE_WARPS], [DECODE_REGS])
