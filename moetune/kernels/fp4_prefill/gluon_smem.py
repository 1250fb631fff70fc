"""The SWAP_AB 0 Gluon kernels: the activations are the wgmma's M side (BLOCK_SIZE_M / 64 warpgroups, both
operands from shared memory), and every thread decodes a share of each weight chunk into a shared buffer
that all of the CTA's warpgroups read. At high density one decode serves BLOCK_SIZE_M rows without the
accumulator registers that cap the SWAP_AB 1 kernel's M tile.

``fp4_wgmma_smem_kernel`` decodes chunk k+1 while chunk k multiplies; ``fp4_wgmma_halves_kernel``
(``MMA_HALVES``) splits each chunk's product in two N halves so that the tensor cores have the next
product queued while the accumulator takes the last one.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moetune.kernels.fp4_prefill.gluon_common import (
    CHUNK,
    async_load,
    barrier,
    decode_words,
    fill_ring,
    store_mask,
    store_words,
    tile_ids,
    tile_row_max,
    weight_rows,
    words_layout,
)


@gluon.jit
def _block_rows(pid_m, sorted_ids_ptr, a_ptr, a_scale_ptr, routes, stride_am, stride_asm, A_DIV: gl.constexpr,
                GATHERED: gl.constexpr, X_LOAD: gl.constexpr, S_ROWS: gl.constexpr, BM: gl.constexpr):
    """The M-block's activation rows (pointers [BM, 1] in X_LOAD, for the copies) and scale pointers (S_ROWS),
    each with whether the row is a route; and the routes in S_ROWS."""
    slot_x = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, X_LOAD))
    route_x = gl.load(sorted_ids_ptr + slot_x)
    row_ok_x = route_x < routes
    slot_s = pid_m * BM + gl.arange(0, BM, S_ROWS)
    route_s = gl.load(sorted_ids_ptr + slot_s)
    row_ok_s = route_s < routes
    if GATHERED:  # rows copied into slot order beforehand
        x_rows = a_ptr + slot_x.to(gl.int64)[:, None] * stride_am
        xs_src = a_scale_ptr + slot_s.to(gl.int64) * stride_asm
    else:
        x_rows = a_ptr + gl.where(row_ok_x, route_x // A_DIV, 0).to(gl.int64)[:, None] * stride_am
        xs_src = a_scale_ptr + gl.where(row_ok_s, route_s // A_DIV, 0).to(gl.int64) * stride_asm
    return x_rows, row_ok_x, xs_src, row_ok_s, route_s


@gluon.jit
def _smem_chunk(k, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows, ws_rows, as_rows, row_ok_m,
                w_cur, w_next_buf, rmax, acc, s_next, xs, MMA: gl.constexpr, P_W: gl.constexpr,
                W_WORDS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RING: gl.constexpr):
    """Chunk k of the SWAP_AB 0 kernel, one wait and two CTA barriers (one here, one the compiler adds for
    the ring's cp.async writes and the wgmma's read of it): the copies of chunk k + RING - 1 go out
    before anything async reads the ring, the wgmma of chunk k runs under the decode of chunk k + 1 into the
    other buffer (a separate allocation, so no barrier between them), the next activation scales are loaded
    a chunk ahead."""
    cp.wait_group(RING - 3)  # chunk k's activations, chunk k + 1's packed weights (mine)
    barrier()  # everyone's; chunk k's decoded weights (stored and fenced last trip); chunk k - 1's slots
    kn = gl.minimum(k + RING - 1, num_k - 1)
    async_load(x_ring.index((k + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
               mask=row_ok_x[:, None])
    async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
    cp.commit_group()
    part = warpgroup_mma(x_ring.index(k % RING), w_cur.permute((1, 0)),
                         gl.zeros([BM, BN], gl.float32, MMA), use_acc=False, is_async=True)
    w_next = decode_words(w_ring.index((k + 1) % RING).load(P_W), s_next, rmax, BN)
    store_words(w_next_buf, w_next, W_WORDS, BN)
    fence_async_shared()
    s_next = gl.load(ws_rows + gl.minimum(k + 2, num_k - 1) * (CHUNK // 32)).to(gl.int32)
    xs_next = gl.load(as_rows + gl.minimum(k + 1, num_k - 1), mask=row_ok_m, other=0.0)
    part, w_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, w_next])
    acc += part * xs[:, None]
    return acc, s_next, xs_next


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_smem_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_smax_ptr, c_ptr, sorted_ids_ptr,
                          expert_ids_ptr, num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm,
                          stride_we, stride_wn, stride_wse, stride_wsn, stride_wsme, stride_cm, GROUP_SIZE_M,
                          A_DIV: gl.constexpr,
                          GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                          RING: gl.constexpr, SCALE_RING: gl.constexpr, num_warps: gl.constexpr,
                          EVEN_N: gl.constexpr = True, HAS_SMAX: gl.constexpr = False):
    """SWAP_AB 0: the activations are the wgmma's M side (BLOCK_SIZE_M / 64 warpgroups, both operands from
    shared memory) and every thread decodes a share of each weight chunk into a shared buffer that all of
    the CTA's warpgroups read: at high density one decode serves BLOCK_SIZE_M rows without the accumulator
    registers that cap the SWAP_AB 1 kernel's M tile. Chunk k+1 is decoded while chunk k multiplies.
    SCALE_RING 1: the activation scales through the ring and a loop of four CTA barriers a chunk, fewer
    instructions; 0: two barriers a chunk. Which is faster depends on K / 128 (docs/kernels/fp4_prefill.md,
    SCALE_RING). Needs num_stages >= 2 with SCALE_RING 0. EVEN_N False: N is not a multiple of BLOCK_SIZE_N
    and the last N tile is a tail (``gluon_common.tile_rows``, ``store_mask``)."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_n = tile_ids(N, num_blocks, GROUP_SIZE_M, BN, EVEN_N)
    if pid_m * BM >= gl.load(num_padded_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BN, 32])
    # one thread a (weight row, 32-K group): its 16 packed bytes in, its 8 e4m3 words out
    P_W: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [num_warps, 1, 1], [2, 1, 0])
    S2: gl.constexpr = gl.SliceLayout(2, P_W)
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, CHUNK], gl.float8e4nv)
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, CHUNK], gl.float8e4nv)
    W_WORDS: gl.constexpr = words_layout(W_SMEM)

    w_rows, ws_rows = weight_rows(w_ptr, w_scale_ptr, expert, pid_n, N, stride_we, stride_wn, stride_wse,
                                  stride_wsn, P_W, BN, EVEN_N)

    if SCALE_RING:  # the activation scales by cp.async, one per row of the M-block
        S_ROWS: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    else:  # loaded a chunk ahead, each thread those of its accumulator rows
        S_ROWS: gl.constexpr = gl.SliceLayout(1, MMA)
    x_rows, row_ok_x, xs_src, row_ok_s, _ = _block_rows(
        pid_m, sorted_ids_ptr, a_ptr, a_scale_ptr, routes, stride_am, stride_asm, A_DIV, GATHERED, X_LOAD,
        S_ROWS, BM)
    cols_x = gl.arange(0, CHUNK, gl.SliceLayout(0, X_LOAD))

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [RING, BM, CHUNK], X_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int32, [RING, BN, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    if SCALE_RING:
        xs_ring = gl.allocate_shared_memory(gl.float32, [RING, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        w_dec = gl.allocate_shared_memory(gl.float8e4nv, [2, BN, CHUNK], W_SMEM)
    else:  # the decoded pair as two allocations: the barrier analysis tells buffers apart, not slots
        w_even = gl.allocate_shared_memory(gl.float8e4nv, [BN, CHUNK], W_SMEM)
        w_odd = gl.allocate_shared_memory(gl.float8e4nv, [BN, CHUNK], W_SMEM)
    # (no scales ring with SCALE_RING 0: x_ring stands in for it, never touched)
    num_k = K // CHUNK
    fill_ring(x_ring, w_ring, xs_ring if SCALE_RING else x_ring, num_k, x_rows, cols_x, row_ok_x, w_rows,
              xs_src, row_ok_s, True, RING, SCALE_RING, False)
    rmax = tile_row_max(ws_rows, w_smax_ptr + expert * stride_wsme, pid_n, N, num_k, S2, BN, EVEN_N,
                        HAS_SMAX)

    cp.wait_group(RING - 2)
    w0 = decode_words(w_ring.index(0).load(P_W), gl.load(ws_rows).to(gl.int32), rmax, BN)
    acc = gl.zeros([BM, BN], gl.float32, MMA)
    if SCALE_RING:  # a CTA barrier for each shared-memory hazard (four a chunk); fewer instructions a chunk
        store_words(w_dec.index(0), w0, W_WORDS, BN)
        s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
        for k in range(num_k):
            cp.wait_group(RING - 2)  # chunk k's copies (mine), then everyone's, and the decoded chunk k
            fence_async_shared()
            barrier()
            xs = xs_ring.index(k % RING).load(gl.SliceLayout(1, MMA))
            part = warpgroup_mma(x_ring.index(k % RING), w_dec.index(k % 2).permute((1, 0)),
                                 gl.zeros([BM, BN], gl.float32, MMA), use_acc=False, is_async=True)
            # the slots chunk k - 1 used are free: every warpgroup waited for its wgmma before the barrier
            kn = gl.minimum(k + RING - 1, num_k - 1)
            async_load(x_ring.index((k + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
                       mask=row_ok_x[:, None])
            async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
            async_load(xs_ring.index((k + RING - 1) % RING), xs_src + kn, mask=row_ok_s)
            cp.commit_group()
            cp.wait_group(RING - 2)  # chunk k + 1's packed weights: the 16 bytes each thread copied itself
            w_next = decode_words(w_ring.index((k + 1) % RING).load(P_W), s_next, rmax, BN)
            store_words(w_dec.index((k + 1) % 2), w_next, W_WORDS, BN)
            s_next = gl.load(ws_rows + gl.minimum(k + 2, num_k - 1) * (CHUNK // 32)).to(gl.int32)
            part, w_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, w_next])
            acc += part * xs[:, None]
    else:  # one wait and two CTA barriers a chunk
        store_words(w_even, w0, W_WORDS, BN)
        fence_async_shared()
        s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
        xs = gl.load(xs_src, mask=row_ok_s, other=0.0)
        for k0 in range(0, num_k, 2):
            acc, s_next, xs = _smem_chunk(k0, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows,
                                          ws_rows, xs_src, row_ok_s, w_even, w_odd, rmax, acc, s_next, xs,
                                          MMA, P_W, W_WORDS, BM, BN, RING)
            acc, s_next, xs = _smem_chunk(k0 + 1, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows,
                                          ws_rows, xs_src, row_ok_s, w_odd, w_even, rmax, acc, s_next, xs,
                                          MMA, P_W, W_WORDS, BM, BN, RING)
    cp.wait_group(0)

    wf = (gl.convert_layout(gl.reshape(rmax, [BN]), gl.SliceLayout(0, MMA)) - 1) << 23  # 2^(rmax - 128)
    n_c = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(0, MMA))
    route_c = gl.load(sorted_ids_ptr + pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, MMA)))
    c_ptrs = c_ptr + route_c.to(gl.int64)[:, None] * stride_cm + n_c[None, :]
    out = acc * wf.to(gl.float32, bitcast=True)[None, :]
    gl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=store_mask(n_c, N, route_c < routes, EVEN_N))


@gluon.jit
def _half(dec, c, h: gl.constexpr, BN: gl.constexpr):
    """Half h of chunk c's decoded weights as the wgmma's B operand [CHUNK, BN / 2]."""
    return dec.index(c % 3).slice(h * (BN // 2), BN // 2).permute((1, 0))


@gluon.jit
def _decode_into(dec, c, w_ring, s, rmax, P_W: gl.constexpr, W_WORDS: gl.constexpr, BN: gl.constexpr,
                 RING: gl.constexpr):
    """Chunk c's packed weights (ring) into its decoded buffer, fenced for the wgmma."""
    store_words(dec.index(c % 3), decode_words(w_ring.index(c % RING).load(P_W), s, rmax, BN), W_WORDS, BN)
    fence_async_shared()


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_halves_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_smax_ptr, c_ptr, sorted_ids_ptr,
                            expert_ids_ptr, num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm,
                            stride_we, stride_wn, stride_wse, stride_wsn, stride_wsme, stride_cm,
                            GROUP_SIZE_M, A_DIV: gl.constexpr,
                            GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                            RING: gl.constexpr, num_warps: gl.constexpr, EVEN_N: gl.constexpr = True,
                            HAS_SMAX: gl.constexpr = False):
    """SWAP_AB 0, SCALE_RING 0, ``MMA_HALVES``: each chunk's wgmma in two N halves, and the next chunk's first
    half issued before this one's second half is rescaled, so the tensor cores have the next product queued
    while the accumulator takes the last one (``fp4_wgmma_smem_kernel`` waits for the whole product, then
    rescales, then meets the barrier, with the tensor cores idle). Three decoded buffers (chunk c + 1 is
    decoded while halves of chunks c and c + 1 may still read theirs); copies land two chunks before their
    weights are decoded, so num_stages >= 3."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_n = tile_ids(N, num_blocks, GROUP_SIZE_M, BN, EVEN_N)
    if pid_m * BM >= gl.load(num_padded_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    MMA_H: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                    instr_shape=[16, BN // 2, 32])
    P_W: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [num_warps, 1, 1], [2, 1, 0])
    S2: gl.constexpr = gl.SliceLayout(2, P_W)
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, CHUNK], gl.float8e4nv)
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, CHUNK], gl.float8e4nv)
    W_WORDS: gl.constexpr = words_layout(W_SMEM)
    w_rows, ws_rows = weight_rows(w_ptr, w_scale_ptr, expert, pid_n, N, stride_we, stride_wn, stride_wse,
                                  stride_wsn, P_W, BN, EVEN_N)
    x_rows, row_ok_x, xs_src, row_ok_s, route_s = _block_rows(
        pid_m, sorted_ids_ptr, a_ptr, a_scale_ptr, routes, stride_am, stride_asm, A_DIV, GATHERED, X_LOAD,
        gl.SliceLayout(1, MMA_H), BM)
    cols_x = gl.arange(0, CHUNK, gl.SliceLayout(0, X_LOAD))

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [RING, BM, CHUNK], X_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int32, [RING, BN, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    dec = gl.allocate_shared_memory(gl.float8e4nv, [3, BN, CHUNK], W_SMEM)
    num_k = K // CHUNK
    fill_ring(x_ring, w_ring, x_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s, True, RING,
              False, False)
    rmax = tile_row_max(ws_rows, w_smax_ptr + expert * stride_wsme, pid_n, N, num_k, S2, BN, EVEN_N,
                        HAS_SMAX)
    cp.wait_group(RING - 3)  # chunks 0 and 1 (mine)
    _decode_into(dec, 0, w_ring, gl.load(ws_rows).to(gl.int32), rmax, P_W, W_WORDS, BN, RING)
    s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
    xs = gl.load(xs_src, mask=row_ok_s, other=0.0)
    barrier()
    zero = gl.zeros([BM, BN // 2], gl.float32, MMA_H)
    part_a = warpgroup_mma(x_ring.index(0), _half(dec, 0, 0, BN), zero, use_acc=False, is_async=True)
    acc_a = zero
    acc_b = zero
    for c in range(num_k - 1):
        part_b = warpgroup_mma(x_ring.index(c % RING), _half(dec, c, 1, BN), zero, use_acc=False,
                               is_async=True)
        _decode_into(dec, c + 1, w_ring, s_next, rmax, P_W, W_WORDS, BN, RING)
        s_next = gl.load(ws_rows + gl.minimum(c + 2, num_k - 1) * (CHUNK // 32)).to(gl.int32)
        xs_next = gl.load(xs_src + c + 1, mask=row_ok_s, other=0.0)
        # (the in-flight half stays a wait's operand, never reassigned from one: a loop carries its token)
        done_a, part_b = warpgroup_mma_wait(num_outstanding=1, deps=[part_a, part_b])
        acc_a += done_a * xs[:, None]
        cp.wait_group(RING - 4)  # chunk c + 1's activations, chunk c + 2's packed weights (mine)
        barrier()  # everyone's: chunk c + 1 decoded; chunk c - 1's slots read by both its halves
        kn = gl.minimum(c + RING - 1, num_k - 1)
        async_load(x_ring.index((c + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
                   mask=row_ok_x[:, None])
        async_load(w_ring.index((c + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
        cp.commit_group()
        part_a = warpgroup_mma(x_ring.index((c + 1) % RING), _half(dec, c + 1, 0, BN), zero, use_acc=False,
                               is_async=True)
        done_b, _ = warpgroup_mma_wait(num_outstanding=1, deps=[part_b, part_a])
        acc_b += done_b * xs[:, None]
        xs = xs_next
    part_b = warpgroup_mma(x_ring.index((num_k - 1) % RING), _half(dec, num_k - 1, 1, BN), zero,
                           use_acc=False, is_async=True)
    done_a, part_b = warpgroup_mma_wait(num_outstanding=1, deps=[part_a, part_b])
    acc_a += done_a * xs[:, None]
    done_b = warpgroup_mma_wait(num_outstanding=0, deps=[part_b])
    acc_b += done_b * xs[:, None]
    cp.wait_group(0)

    wf = (gl.reshape(rmax, [BN]) - 1) << 23  # 2^(rmax - 128)
    PAIRS: gl.constexpr = gl.BlockedLayout([1, 2], [32, 1], [num_warps, 1], [1, 0])  # both halves' n a thread
    wf_a, wf_b = gl.split(gl.convert_layout(gl.permute(gl.reshape(wf, [2, BN // 2]), (1, 0)), PAIRS))
    ok = (route_s < routes)[:, None]
    for h in gl.static_range(2):
        n_c = pid_n * BN + h * (BN // 2) + gl.arange(0, BN // 2, gl.SliceLayout(0, MMA_H))
        c_ptrs = c_ptr + route_s.to(gl.int64)[:, None] * stride_cm + n_c[None, :]
        if h == 0:
            acc, wf_h = acc_a, wf_a
        else:
            acc, wf_h = acc_b, wf_b
        wf_h = gl.convert_layout(wf_h, gl.SliceLayout(0, MMA_H)).to(gl.float32, bitcast=True)
        mask = ok
        if not EVEN_N:  # a tail tile: no column past N
            mask = ok & (n_c < N)[None, :]
        gl.store(c_ptrs, (acc * wf_h[None, :]).to(c_ptr.dtype.element_ty), mask=mask)
