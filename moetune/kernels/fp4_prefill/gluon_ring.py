"""The SWAP_AB 1 Gluon kernel (``fp4_wgmma_kernel``): the weights are the wgmma's M side, decoded into the
A operand's registers; the activations (the routes of one M-block, 16-256 of them) are its N side, read
from shared memory.

Each 128-K chunk's wgmma is issued async; under it the copies of a later chunk go out and the next chunk's
packed weights are decoded, and only then is the product waited for and rescaled. Two chunks a loop trip,
so the decode of chunk k+1 never writes registers the in-flight wgmma reads.

Switches:

- ``SCALE_RING`` 1 copies each chunk's activation scales through the ring (one per M-block row) instead of
  every thread loading one per accumulator column through its own pointer: fewer registers and loop
  instructions (docs/kernels/fp4_prefill.md, SCALE_RING).
- ``A_RESIDENT``: a program takes N_TILES consecutive N tiles of its M-block and keeps the M-block's
  activations (all K / 128 chunks) in shared memory, copied once with the first tile's.
- ``RING_SPLIT``: each ring as two allocations, even and odd chunks, and a commit group that carries the
  next chunk's weights (``_split_chunk``). Triton's barrier analysis tells allocations apart, not a
  buffer's slots: the one-buffer rings take three CTA barriers a chunk (after both cp.async waits, and
  before the copies into the slot the last chunk read), the split rings one with an even ring (num_stages
  1 or 3), two with an odd one. Bit for bit the one-buffer rings' numbers (docs/kernels/fp4_prefill.md,
  RING_SPLIT).
- ``MAXNREG`` is a launch option (``gluon_gemm``), not a constexpr of this kernel.
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
    decode_words,
    fill_ring,
    store_mask,
    tile_ids,
    tile_row_max,
    weight_rows,
    x_copy,
    x_slot,
)


@gluon.constexpr_function
def split_layout(a_lin):
    """The A operand's [BN, 128] layout as [BN, 4(q), 4(b), 2(h), 4(i)] (logical K = 32b + 16h + 4q + i); its
    slices hold the packed words [BN, q, b] and the lut's output words [BN, q, b, h]. ``a_lin``: the A
    operand as a linear layout. Registers: a word's bytes, then the word index b, so a thread's four words
    of a (row, group) are consecutive registers (one 16-byte copy); the A operand differs only in register
    order."""
    k_to = {1: [0, 0, 0, 0, 1], 2: [0, 0, 0, 0, 2], 4: [0, 1, 0, 0, 0], 8: [0, 2, 0, 0, 0],
            16: [0, 0, 0, 1, 0], 32: [0, 0, 1, 0, 0], 64: [0, 0, 2, 0, 0]}

    def remap(bases):
        return [[n, 0, 0, 0, 0] if k == 0 else k_to[k] for n, k in bases]

    reg = remap(a_lin.reg_bases)
    reg = [b for b in reg if b[4]] + [b for b in reg if b[2]] + [b for b in reg if not (b[4] or b[2])]
    return gl.DistributedLinearLayout(reg, remap(a_lin.lane_bases), remap(a_lin.warp_bases),
                                      remap(a_lin.block_bases), [a_lin.shape[0], 4, 4, 2, 4])


@gluon.jit
def _keep_alive(a, never):
    """A use of the A operand's registers after its wgmma's wait (a shared store predicated on a runtime 0):
    fp8 tensors cannot be wait deps ("Unexpected bitwidth in WGMMAWaitGroupOp: 8"), and without a later use
    ptxas reuses those registers for the next decode and moves the wait above it."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $8, 0; @p st.shared.v4.b32 [$8], {$4, $5, $6, $7}; "
        "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
        "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [a.to(gl.uint8, bitcast=True), never], dtype=gl.uint8, is_pure=False,
        pack=16)


@gluon.jit
def _decode(words, s, rmax, L5: gl.constexpr, BN: gl.constexpr):
    """``decode_words`` in the A operand's registers. Words cross the loop, not bytes: a carried byte
    tensor is repacked every trip."""
    return gl.convert_layout(decode_words(words, s, rmax, BN), gl.SliceLayout(4, L5), assert_trivial=True)


@gluon.jit
def _operand(w, A_OP: gl.constexpr, BN: gl.constexpr):
    """Words [BN, q, b, h] -> the fp8 A operand [BN, 128] in logical K order (the asm renames registers)."""
    w = gl.expand_dims(w, 4).broadcast_to([BN, 4, 4, 2, 4])
    b = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [w], dtype=gl.uint8, is_pure=True, pack=4)
    b = b.permute((0, 2, 3, 1, 4)).reshape([BN, 128])
    return gl.convert_layout(b.to(gl.float8e4nv, bitcast=True), A_OP, assert_trivial=True)


@gluon.jit
def _chunk_end(k, num_k, part, a_op, a_next, acc, s_far, xs, ws_rows, as_rows, row_ok_m, never,
               SCALE_RING: gl.constexpr):
    """A chunk's last steps under its wgmma: the weight scales of chunk k + 3 and (SCALE_RING 0) the
    activation scales of chunk k + 1 loaded; then the wait and the rescale by the chunk's activation
    scales."""
    s_next = s_far
    s_far = gl.load(ws_rows + gl.minimum(k + 3, num_k - 1) * (CHUNK // 32)).to(gl.int32)
    if SCALE_RING:
        xs_next = xs
    else:
        xs_next = gl.load(as_rows + gl.minimum(k + 1, num_k - 1), mask=row_ok_m, other=0.0)

    # a_next among the wait's operands keeps the decode ahead of the wait (ptxas would sink it below)
    part, a_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, a_next])
    _keep_alive(a_op, never)
    acc += part * xs[None, :]
    return acc, a_next, s_next, s_far, xs_next


@gluon.jit
def _chunk(k, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows, ws_rows, xs_ring, xs_src, row_ok_s,
           as_rows, row_ok_m, rmax, acc, a_cur, s_next, s_far, xs, never, fresh, MMA: gl.constexpr,
           A_OP: gl.constexpr, L5: gl.constexpr, P_W: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr,
           RING: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr):
    """Chunk k: its wgmma issued async; under it, the copies of chunk k + RING - 1, the decode of chunk
    k + 1 and the scale loads of chunk k + 3; then the wait and the rescale by the chunk's activation
    scales."""
    cp.wait_group(RING - 2)
    fence_async_shared()
    if SCALE_RING:  # this chunk's activation scales came with its activations
        xs = xs_ring.index(k % RING).load(gl.SliceLayout(0, MMA))
    a_op = _operand(a_cur, A_OP, BN)
    part = warpgroup_mma(a_op, x_slot(x_ring, k, k, RING, A_RESIDENT).permute((1, 0)),
                         gl.zeros([BN, BM], gl.float32, MMA), use_acc=False, is_async=True)

    kn = gl.minimum(k + RING - 1, num_k - 1)  # past the end: the last chunk again, never used
    x_copy(x_ring, k + RING - 1, kn, x_rows, cols_x, row_ok_x, fresh & (k + RING - 1 < num_k), RING,
           A_RESIDENT)
    async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
    if SCALE_RING:
        async_load(xs_ring.index((k + RING - 1) % RING), xs_src + kn, mask=row_ok_s)
    cp.commit_group()
    cp.wait_group(RING - 2)  # chunk k + 1's weights: each thread reads back the 16 bytes it copied
    a_next = _decode(w_ring.index((k + 1) % RING).load(P_W), s_next, rmax, L5, BN)
    return _chunk_end(k, num_k, part, a_op, a_next, acc, s_far, xs, ws_rows, as_rows, row_ok_m, never,
                      SCALE_RING)


@gluon.jit
def _split_slot(even, odd, c, PARITY: gl.constexpr):
    """Chunk c's slot in a ring split by chunk parity (PARITY, c's, known at compile time)."""
    ring = even
    if PARITY:
        ring = odd
    return ring.index((c // 2) % ring.shape[0])


@gluon.jit
def _split_copies(c, num_k, x_ev, x_od, w_ev, w_od, xs_ev, xs_od, x_rows, cols_x, row_ok_x, w_rows, xs_src,
                  row_ok_s, fresh, PARITY: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr,
                  CLAMP: gl.constexpr = True):
    """Commit group c: chunk c's activations (and their scales) and chunk c + 1's weights; past the last
    chunk the last chunk again, never used (CLAMP; the fill's first group needs none: K / 128 >= 2)."""
    kc = c
    wc = c + 1
    if CLAMP:
        kc = gl.minimum(c, num_k - 1)
        wc = gl.minimum(c + 1, num_k - 1)
    if A_RESIDENT:
        if fresh:
            async_load(_split_slot(x_ev, x_od, kc, PARITY), x_rows + kc * CHUNK + cols_x[None, :],
                       mask=row_ok_x[:, None])
    else:
        async_load(_split_slot(x_ev, x_od, c, PARITY), x_rows + kc * CHUNK + cols_x[None, :],
                   mask=row_ok_x[:, None])
    async_load(_split_slot(w_ev, w_od, c + 1, 1 - PARITY), w_rows + wc * (CHUNK // 8))
    if SCALE_RING:
        async_load(_split_slot(xs_ev, xs_od, c, PARITY), xs_src + kc, mask=row_ok_s)
    cp.commit_group()


@gluon.jit
def _split_chunk(k, num_k, x_ev, x_od, x_rows, cols_x, row_ok_x, w_ev, w_od, w_rows, ws_rows, xs_ev, xs_od,
                 xs_src, row_ok_s, as_rows, row_ok_m, rmax, acc, a_cur, s_next, s_far, xs, never, fresh,
                 PARITY: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr, L5: gl.constexpr,
                 P_W: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, RING: gl.constexpr,
                 SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr):
    """``_chunk`` with ``RING_SPLIT``: one CTA barrier a chunk instead of three. Each ring is two buffers,
    even and odd chunks, and a commit group carries the next chunk's weights, so after the wait for group k
    chunk k's activations and chunk k + 1's weights are in, and group k + RING - 1's copies, issued at once,
    touch no buffer this chunk reads (with RING even: they are the other parity's): Triton's barrier
    analysis, which tells buffers apart but not a buffer's slots, adds no barrier between them. The slots
    they overwrite were last read before this chunk's barrier."""
    cp.wait_group(RING - 2)
    fence_async_shared()
    _split_copies(k + RING - 1, num_k, x_ev, x_od, w_ev, w_od, xs_ev, xs_od, x_rows, cols_x, row_ok_x, w_rows,
                  xs_src, row_ok_s, fresh & (k + RING - 1 < num_k), (PARITY + RING - 1) % 2, SCALE_RING,
                  A_RESIDENT)
    if SCALE_RING:
        xs = _split_slot(xs_ev, xs_od, k, PARITY).load(gl.SliceLayout(0, MMA))
    a_op = _operand(a_cur, A_OP, BN)
    part = warpgroup_mma(a_op, _split_slot(x_ev, x_od, k, PARITY).permute((1, 0)),
                         gl.zeros([BN, BM], gl.float32, MMA), use_acc=False, is_async=True)
    a_next = _decode(_split_slot(w_ev, w_od, k + 1, 1 - PARITY).load(P_W), s_next, rmax, L5, BN)
    return _chunk_end(k, num_k, part, a_op, a_next, acc, s_far, xs, ws_rows, as_rows, row_ok_m, never,
                      SCALE_RING)


# num_blocks moves with E and the routes, GROUP_SIZE_M only orders the programs: run-time values.
@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, w_smax_ptr, c_ptr, sorted_ids_ptr,
                     expert_ids_ptr, num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm,
                     stride_we, stride_wn, stride_wse, stride_wsn, stride_wsme, stride_cm, GROUP_SIZE_M,
                     A_DIV: gl.constexpr,
                     GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                     RING: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr,
                     X_SLOTS: gl.constexpr, N_TILES: gl.constexpr, num_warps: gl.constexpr,
                     RING_SPLIT: gl.constexpr = False, EVEN_N: gl.constexpr = True,
                     HAS_SMAX: gl.constexpr = False):
    """``w_ptr``: the packed weights as int32 words [E, N, K / 8]. K % 256 == 0; N any, its last N tile a
    tail (``gluon_common.tile_rows``, ``store_mask``) unless EVEN_N (N % BLOCK_SIZE_N == 0). A program takes
    N_TILES consecutive N tiles of its M-block (N_TILES divides the N tiles); with ``A_RESIDENT`` their
    activations (X_SLOTS = K / 128 chunks) are copied once, with the first tile's, and stay in shared
    memory for the others."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_g = tile_ids(N, num_blocks, GROUP_SIZE_M, BN * N_TILES, EVEN_N)
    if pid_m * BM >= gl.load(num_padded_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 32])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    L5: gl.constexpr = split_layout(gl.to_linear_layout(A_OP, [BN, CHUNK]))
    P_W: gl.constexpr = gl.SliceLayout(3, gl.SliceLayout(4, L5))  # packed words [BN, q, b]
    S2: gl.constexpr = gl.SliceLayout(2, P_W)  # group scales [BN, q]
    X_LOAD: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, CHUNK], gl.float8e4nv)

    # the M-block's activation rows (cp.async, 16 bytes a thread) and their scales (accumulator columns)
    slot_x = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, X_LOAD))
    route_x = gl.load(sorted_ids_ptr + slot_x)
    row_ok_x = route_x < routes
    slot_m = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(0, MMA))
    route_m = gl.load(sorted_ids_ptr + slot_m)
    row_ok_m = route_m < routes
    if GATHERED:  # rows copied into slot order beforehand
        a_row_x = slot_x.to(gl.int64)
        a_row_m = slot_m.to(gl.int64)
    else:
        a_row_x = gl.where(row_ok_x, route_x // A_DIV, 0).to(gl.int64)
        a_row_m = gl.where(row_ok_m, route_m // A_DIV, 0).to(gl.int64)
    x_rows = a_ptr + a_row_x[:, None] * stride_am
    cols_x = gl.arange(0, CHUNK, gl.SliceLayout(0, X_LOAD))
    as_rows = a_scale_ptr + a_row_m * stride_asm
    # SCALE_RING: the activation scales by cp.async too, one per row of the M-block (a 1-D layout), instead of
    # one pointer and one carried value per accumulator column in every thread
    XS_L: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    slot_s = pid_m * BM + gl.arange(0, BM, XS_L)
    route_s = gl.load(sorted_ids_ptr + slot_s)
    row_ok_s = route_s < routes
    if GATHERED:
        xs_src = a_scale_ptr + slot_s.to(gl.int64) * stride_asm
    else:
        xs_src = a_scale_ptr + gl.where(row_ok_s, route_s // A_DIV, 0).to(gl.int64) * stride_asm
    XS_SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    W_SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    if RING_SPLIT:  # each ring as two allocations, even and odd chunks (_split_chunk)
        HALF: gl.constexpr = (RING + 1) // 2
        x_ring = gl.allocate_shared_memory(gl.float8e4nv, [(X_SLOTS + 1) // 2, BM, CHUNK], X_SMEM)
        x_odd = gl.allocate_shared_memory(gl.float8e4nv, [(X_SLOTS + 1) // 2, BM, CHUNK], X_SMEM)
        w_ring = gl.allocate_shared_memory(gl.int32, [HALF, BN, 4, 4], W_SMEM)
        w_odd = gl.allocate_shared_memory(gl.int32, [HALF, BN, 4, 4], W_SMEM)
        xs_ring = gl.allocate_shared_memory(gl.float32, [HALF if SCALE_RING else 1, BM], XS_SMEM)
        xs_odd = gl.allocate_shared_memory(gl.float32, [HALF if SCALE_RING else 1, BM], XS_SMEM)
    else:
        x_ring = gl.allocate_shared_memory(gl.float8e4nv, [X_SLOTS, BM, CHUNK], X_SMEM)
        w_ring = gl.allocate_shared_memory(gl.int32, [RING, BN, 4, 4], W_SMEM)
        xs_ring = gl.allocate_shared_memory(gl.float32, [RING if SCALE_RING else 1, BM], XS_SMEM)
    num_k = K // CHUNK
    never = (gl.full([BN, CHUNK], stride_cm, gl.int32, A_OP) < 0).to(gl.uint8)  # a runtime 0 (_keep_alive)
    for j in range(N_TILES):
        pid_n = pid_g * N_TILES + j
        fresh = j == 0
        w_rows, ws_rows = weight_rows(w_ptr, w_scale_ptr, expert, pid_n, N, stride_we, stride_wn, stride_wse,
                                      stride_wsn, P_W, BN, EVEN_N)
        if RING_SPLIT:
            async_load(w_ring.index(0), w_rows)  # chunk 0's weights, in commit group 0
            for i in gl.static_range(RING - 1):
                _split_copies(i, num_k, x_ring, x_odd, w_ring, w_odd, xs_ring, xs_odd, x_rows, cols_x,
                              row_ok_x, w_rows, xs_src, row_ok_s, fresh & (i < num_k), i % 2, SCALE_RING,
                              A_RESIDENT, i >= 1)
        else:
            fill_ring(x_ring, w_ring, xs_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s,
                      fresh, RING, SCALE_RING, A_RESIDENT)
        rmax = tile_row_max(ws_rows, w_smax_ptr + expert * stride_wsme, pid_n, N, num_k, S2, BN, EVEN_N,
                            HAS_SMAX)

        cp.wait_group(RING - 2)
        a_cur = _decode(w_ring.index(0).load(P_W), gl.load(ws_rows).to(gl.int32), rmax, L5, BN)
        s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
        s_far = gl.load(ws_rows + 2 * (CHUNK // 32)).to(gl.int32)
        if SCALE_RING:
            xs = gl.zeros([BM], gl.float32, gl.SliceLayout(0, MMA))  # read from the ring in each chunk
        else:
            xs = gl.load(as_rows, mask=row_ok_m, other=0.0)
        acc = gl.zeros([BN, BM], gl.float32, MMA)
        for k0 in range(0, num_k, 2):
            for u in gl.static_range(2):
                if RING_SPLIT:
                    acc, a_cur, s_next, s_far, xs = _split_chunk(
                        k0 + u, num_k, x_ring, x_odd, x_rows, cols_x, row_ok_x, w_ring, w_odd, w_rows,
                        ws_rows, xs_ring, xs_odd, xs_src, row_ok_s, as_rows, row_ok_m, rmax, acc, a_cur,
                        s_next, s_far, xs, never, fresh, u, MMA, A_OP, L5, P_W, BN, BM, RING, SCALE_RING,
                        A_RESIDENT)
                else:
                    acc, a_cur, s_next, s_far, xs = _chunk(
                        k0 + u, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows, ws_rows, xs_ring,
                        xs_src, row_ok_s, as_rows, row_ok_m, rmax, acc, a_cur, s_next, s_far, xs, never,
                        fresh, MMA, A_OP, L5, P_W, BN, BM, RING, SCALE_RING, A_RESIDENT)
        cp.wait_group(0)

        wf = (gl.convert_layout(gl.reshape(rmax, [BN]), gl.SliceLayout(1, MMA)) - 1) << 23  # 2^(rmax - 128)
        n_c = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, MMA))
        if SCALE_RING:
            route_c = gl.load(sorted_ids_ptr + slot_m)  # loaded again rather than kept live through the loop
        else:
            route_c = route_m
        c_ptrs = c_ptr + route_c.to(gl.int64)[None, :] * stride_cm + n_c[:, None]
        out = acc * wf.to(gl.float32, bitcast=True)[:, None]
        gl.store(c_ptrs, out.to(c_ptr.dtype.element_ty),
                 mask=store_mask(n_c, N, route_c < routes, EVEN_N, N_FIRST=True))
