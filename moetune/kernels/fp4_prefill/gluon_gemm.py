"""The FP4 grouped GEMM written in Gluon for sm_90 (``IMPL "gluon"``): the decode of K chunk k+1 runs while
the tensor cores multiply chunk k.

Same numbers as ``fp4_gemm`` with ``DECODE fp8_row``, ``UNPACK lut``, ``SWAP_AB`` and 128-K chunks: weights
re-based on their row's largest scale (exact while a row's scales differ by at most 9), one fp8 wgmma per
chunk into a fresh accumulator, ``acc += part * x_scale`` per chunk, the row factor ``2^(rmax - 128)`` at
the end. ``tl.dot`` waits for every wgmma whose operand the loop made in registers before the next step
starts (``pendings = 0`` in every fp4 config's TTGIR); here the wgmma is issued async and waited for after
the next chunk's decode.

K order. The wgmma A fragment (the decoded weights, registers) gives lane ``q = lane % 4`` the K runs
``4q..4q+3`` and ``16+4q..16+4q+3`` of every 32. The order inside a 128-K chunk is free if the activations
follow it, so thread q takes the whole 32-K scale group q of each of its rows: logical ``32b + 16h + 4q + i``
is real ``32q + 8b + 4h + i``. A thread loads its group's 16 packed bytes as one vector, makes the group's
e4m3 pool once and turns each 4-byte word (b) into the two registers (h) the wgmma reads, with no data
movement between threads (``assert_trivial`` checks it). The activations come in that order, written so by
their producers (``quantize_fp8_act(k_order="wgmma")``, the swiglu quantizer) or permuted here
(``moetune.quant.fp8_act.to_wgmma_k_order``); their 128-K scales do not move.

Pipelining is by hand (Gluon pipelines nothing): the packed weights and the activation tile of chunk
``k + num_stages`` are copied (cp.async) into a ring of ``num_stages + 1`` slots while chunk k multiplies;
two chunks a loop trip, so the decode of chunk k+1 never writes registers the in-flight wgmma reads.

``SCALE_RING`` 1 copies each chunk's activation scales through the ring as well (one per M-block row)
instead of every thread loading one per accumulator column through its own pointer: offline, BM32 136
registers instead of 168 (capped; the launcher caps SCALE_RING's at 128, four CTAs an SM, no spill) and 392
loop instructions instead of 447, BM64 208 without spill instead of 255, BM128 BN128 13 spilled loads instead
of 305. On the H200 (session 17) 1.09-1.14x the SCALE_RING 0 kernel's time at 1536-12288 routes for gate/up.

``RING_SPLIT`` (SWAP_AB 1): each ring as two allocations, even and odd chunks, and a commit group carrying
the next chunk's weights (``_split_chunk``). Triton's barrier analysis tells allocations apart, not a
buffer's slots: the one-buffer rings take three CTA barriers a chunk (after both cp.async waits, and before
the copies into the slot the last chunk read), the split rings one with an even ring (num_stages 1 or 3), two
with an odd one. Offline (Triton 3.6, sm_90) the down 6144 pick's loop is 388 instructions instead of 394,
2 barriers a two-chunk trip instead of 6, the BM32 resident kernel's spills 5 / 5 instead of 13 / 11
(results/fp4_prefill.md, session 22). Bit for bit the one-buffer rings' numbers (a GPU test); its time on
the H200 not measured yet. ``MAXNREG`` (SWAP_AB 1) replaces the launcher's register cap: at 96 the 16 x 64
tile with SCALE_RING and three stages holds five CTAs an SM without a spill (offline; the 32-row tile
spills 66 words).

``MMA_HALVES`` (SWAP_AB 0): each chunk's product in two N halves, the next chunk's first half queued before
this one's second half is rescaled; on the H200 faster only with 64-row tiles (gate/up at 37-59 rows an
expert, session 18). ``DECODE_WARPS`` 4 or 8 (SWAP_AB 0): persistent and warp-specialized, a partition of that
many warps copies and decodes for the MMA warps through mbarriers (``fp4_wgmma_ws_kernel``; down 24576 routes
0.587 ms against the plain loop's 0.655, sessions 18-19; what each of its parts costs: results/fp4_prefill.md,
session 19, and ``benchmarks/ws_ablation.py``). A persistent version of the plain SWAP_AB 0 loop was slower at
every point measured and was removed (results/fp4_prefill.md, session 18), and so was one of the SWAP_AB 1
kernel (equal runs of the filled tiles, a program an SM slot: 4-8% slower at down 6144, session 21).

``A_RESIDENT``: a program keeps its M-block's activations (all K / 128 chunks) in shared memory over several
N tiles and copies them once: DECODE_WARPS' persistent programs over their run of consecutive tiles (down
24576 routes 0.500 ms with bf16 rows), the SWAP_AB 1 kernel's over RESIDENT_N_TILES tiles (1152-3072 routes
with 16-row tiles; slower with 32, whose per-tile prologue the copies no longer hide; session 20).

GPU only: Gluon has no interpreter. Measured on an H200 against the Triton kernel's picks in
results/fp4_prefill.md, session 16.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy as cp,
)
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moetune.device import interpreter_active
from moetune.kernels.fp4_prefill.triton_gemm import _E2M1_TO_E4M3_LUT_ASM, _E4M3_POOL_ASM
from moetune.quant.fp8_act import to_wgmma_k_order

# cp.async global -> shared: async_copy_global_to_shared in Triton 3.6, async_load in later versions
_async_load = getattr(cp, "async_load", None) or cp.async_copy_global_to_shared
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # the CTA barrier (renamed after Triton 3.6)
CHUNK = gl.constexpr(128)  # K per wgmma: one activation scale group
# The lut PTX for one packed word per call ($2; pools $3, $4) -> the e4m3 words of k0-3 ($0) and k4-7 ($1).
_LUT_WORD_ASM = gl.constexpr(_E2M1_TO_E4M3_LUT_ASM.value.replace("$7", "$4"))


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


@gluon.constexpr_function
def words_layout(w_smem):
    """The decoded-weight buffer's bytes (``w_smem``, e4m3 [BN, 128]) as int32 words [BN, 32]: a 128-byte row
    either way, so the same swizzle."""
    return gl.NVMMASharedLayout(swizzle_byte_width=w_smem.swizzle_byte_width, element_bitwidth=32, rank=2)


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
def _decode_words(words, s, rmax, BN: gl.constexpr):
    """Packed words [BN, 4(q), 4(b)] (real K order), their group scales s [BN, 4] and the row's largest
    scale rmax [BN, 1] -> the re-based e4m3 words [BN, q, b, h] (4 weights each, h: the word's K half)."""
    d = gl.minimum(rmax - s, 15)
    lo, hi = gl.inline_asm_elementwise(_E4M3_POOL_ASM, "=r,=r,r", [d], dtype=(gl.int32, gl.int32),
                                       is_pure=True, pack=1)
    lo = gl.expand_dims(lo, 2).broadcast_to([BN, 4, 4])
    hi = gl.expand_dims(hi, 2).broadcast_to([BN, 4, 4])
    first, second = gl.inline_asm_elementwise(_LUT_WORD_ASM, "=r,=r,r,r,r", [words, lo, hi],
                                              dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    return gl.join(first, second)


@gluon.jit
def _decode(words, s, rmax, L5: gl.constexpr, BN: gl.constexpr):
    """``_decode_words`` in the A operand's registers. Words cross the loop, not bytes: a carried byte
    tensor is repacked every trip."""
    return gl.convert_layout(_decode_words(words, s, rmax, BN), gl.SliceLayout(4, L5), assert_trivial=True)


@gluon.jit
def _operand(w, A_OP: gl.constexpr, BN: gl.constexpr):
    """Words [BN, q, b, h] -> the fp8 A operand [BN, 128] in logical K order (the asm renames registers)."""
    w = gl.expand_dims(w, 4).broadcast_to([BN, 4, 4, 2, 4])
    b = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [w], dtype=gl.uint8, is_pure=True, pack=4)
    b = b.permute((0, 2, 3, 1, 4)).reshape([BN, 128])
    return gl.convert_layout(b.to(gl.float8e4nv, bitcast=True), A_OP, assert_trivial=True)


@gluon.jit
def _tile_of(t, N, num_blocks, GROUP_SIZE_M, BN: gl.constexpr):
    """Tile t's (M-block, N-tile): GROUP_SIZE_M M-blocks a group, N-tiles within it."""
    num_pid_n = N // BN
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (t // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = gl.minimum(num_blocks - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((t % num_pid_in_group) % group_size_m)
    pid_n = (t % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@gluon.jit
def _tile_ids(N, num_blocks, GROUP_SIZE_M, BN: gl.constexpr):
    """This program's (M-block, N-tile)."""
    return _tile_of(gl.program_id(0), N, num_blocks, GROUP_SIZE_M, BN)


@gluon.jit
def _weight_rows(w_ptr, w_scale_ptr, expert, pid_n, stride_we, stride_wn, stride_wse, stride_wsn,
                 P_W: gl.constexpr, BN: gl.constexpr):
    """The N tile's chunk-0 pointers: packed words [BN, 4(q), 4(b)] in P_W, group scales [BN, 4(q)]."""
    S2: gl.constexpr = gl.SliceLayout(2, P_W)
    n_w = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, gl.SliceLayout(2, P_W)))
    q_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, P_W)))
    b_w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, P_W)))
    w_rows = (w_ptr + expert * stride_we + gl.expand_dims(gl.expand_dims(n_w.to(gl.int64) * stride_wn, 1), 2)
              + gl.expand_dims(gl.expand_dims(q_w * 4, 0), 2) + gl.expand_dims(gl.expand_dims(b_w, 0), 1))
    return w_rows, _scale_rows(w_scale_ptr, expert, pid_n, stride_wse, stride_wsn, S2, BN)


@gluon.jit
def _scale_rows(w_scale_ptr, expert, pid_n, stride_wse, stride_wsn, S2: gl.constexpr, BN: gl.constexpr):
    """The N tile's chunk-0 group scale pointers [BN, 4(q)] in S2."""
    n_g = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(1, S2))
    return (w_scale_ptr + expert * stride_wse + gl.expand_dims(n_g.to(gl.int64) * stride_wsn, 1)
            + gl.expand_dims(gl.arange(0, 4, gl.SliceLayout(0, S2)), 0))


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
def _row_max_scale(ws_rows, num_k, S2: gl.constexpr, BN: gl.constexpr):
    """The largest scale code of each weight row [BN, 1], eight loads in flight at a time."""
    smax = gl.zeros([BN, 4], gl.int32, S2)
    for k0 in range(0, num_k, 8):
        for u in gl.static_range(8):
            s = gl.load(ws_rows + gl.minimum(k0 + u, num_k - 1) * (CHUNK // 32))
            smax = gl.maximum(smax, s.to(gl.int32))
    return gl.expand_dims(gl.max(smax, axis=1), 1)


@gluon.jit
def _fill_ring(x_ring, w_ring, xs_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s, fresh,
               RING: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr):
    """The copies of chunks 0 .. RING - 2, one commit group each (resident activations: only if ``fresh``).
    Past the last chunk (K / 128 < RING - 1; K / 128 >= 2 always) the last chunk again, never used, as in
    the loop (a masked copy costs the loop's instructions there: 2.5-3% at down 6144 on the H200, and a
    clamp of chunks 0 and 1 too, their constant offsets: 1.5%; results/fp4_prefill.md, session 21)."""
    for i in gl.static_range(RING - 1):
        kc = i
        live = fresh
        if i >= 2:
            kc = gl.minimum(i, num_k - 1)
            live = fresh & (i < num_k)
        _x_copy(x_ring, i, kc, x_rows, cols_x, row_ok_x, live, RING, A_RESIDENT)
        _async_load(w_ring.index(i), w_rows + kc * (CHUNK // 8))
        if SCALE_RING:
            _async_load(xs_ring.index(i), xs_src + kc, mask=row_ok_s)
        cp.commit_group()


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
    part = warpgroup_mma(a_op, _x_slot(x_ring, k, k, RING, A_RESIDENT).permute((1, 0)),
                         gl.zeros([BN, BM], gl.float32, MMA), use_acc=False, is_async=True)

    kn = gl.minimum(k + RING - 1, num_k - 1)  # past the end: the last chunk again, never used
    _x_copy(x_ring, k + RING - 1, kn, x_rows, cols_x, row_ok_x, fresh & (k + RING - 1 < num_k), RING,
            A_RESIDENT)
    _async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
    if SCALE_RING:
        _async_load(xs_ring.index((k + RING - 1) % RING), xs_src + kn, mask=row_ok_s)
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
            _async_load(_split_slot(x_ev, x_od, kc, PARITY), x_rows + kc * CHUNK + cols_x[None, :],
                        mask=row_ok_x[:, None])
    else:
        _async_load(_split_slot(x_ev, x_od, c, PARITY), x_rows + kc * CHUNK + cols_x[None, :],
                    mask=row_ok_x[:, None])
    _async_load(_split_slot(w_ev, w_od, c + 1, 1 - PARITY), w_rows + wc * (CHUNK // 8))
    if SCALE_RING:
        _async_load(_split_slot(xs_ev, xs_od, c, PARITY), xs_src + kc, mask=row_ok_s)
    cp.commit_group()


@gluon.jit
def _split_chunk(k, num_k, x_ev, x_od, x_rows, cols_x, row_ok_x, w_ev, w_od, w_rows, ws_rows, xs_ev, xs_od,
                 xs_src, row_ok_s, as_rows, row_ok_m, rmax, acc, a_cur, s_next, s_far, xs, never, fresh,
                 PARITY: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr, L5: gl.constexpr,
                 P_W: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, RING: gl.constexpr,
                 SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr):
    """``_chunk`` with ``RING_SPLIT``: one CTA barrier a chunk instead of three (offline, Triton 3.6). Each
    ring is two buffers, even and odd chunks, and a commit group carries the next chunk's weights, so after
    the wait for group k chunk k's activations and chunk k + 1's weights are in, and group k + RING - 1's
    copies, issued at once, touch no buffer this chunk reads (with RING even: they are the other parity's):
    Triton's barrier analysis, which tells buffers apart but not a buffer's slots, adds no barrier between
    them. The slots they overwrite were last read before this chunk's barrier."""
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
def fp4_wgmma_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr,
                     num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm, stride_we, stride_wn,
                     stride_wse, stride_wsn, stride_cm, GROUP_SIZE_M, A_DIV: gl.constexpr,
                     GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                     RING: gl.constexpr, SCALE_RING: gl.constexpr, A_RESIDENT: gl.constexpr,
                     X_SLOTS: gl.constexpr, N_TILES: gl.constexpr, num_warps: gl.constexpr,
                     RING_SPLIT: gl.constexpr = False):
    """``w_ptr``: the packed weights as int32 words [E, N, K / 8]. N % (BLOCK_SIZE_N * N_TILES) == 0,
    K % 256 == 0. A program takes N_TILES consecutive N tiles of its M-block; with ``A_RESIDENT`` their
    activations (X_SLOTS = K / 128 chunks) are copied once, with the first tile's, and stay in shared
    memory for the others."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_g = _tile_ids(N, num_blocks, GROUP_SIZE_M, BN * N_TILES)
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
        w_rows, ws_rows = _weight_rows(w_ptr, w_scale_ptr, expert, pid_n, stride_we, stride_wn, stride_wse,
                                       stride_wsn, P_W, BN)
        if RING_SPLIT:
            _async_load(w_ring.index(0), w_rows)  # chunk 0's weights, in commit group 0
            for i in gl.static_range(RING - 1):
                _split_copies(i, num_k, x_ring, x_odd, w_ring, w_odd, xs_ring, xs_odd, x_rows, cols_x,
                              row_ok_x, w_rows, xs_src, row_ok_s, fresh & (i < num_k), i % 2, SCALE_RING,
                              A_RESIDENT, i >= 1)
        else:
            _fill_ring(x_ring, w_ring, xs_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s,
                       fresh, RING, SCALE_RING, A_RESIDENT)
        rmax = _row_max_scale(ws_rows, num_k, S2, BN)

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
        gl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=(route_c < routes)[None, :])


@gluon.jit
def _store_words(dst, words, W_WORDS: gl.constexpr, BN: gl.constexpr):
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
def _smem_chunk(k, num_k, x_ring, x_rows, cols_x, row_ok_x, w_ring, w_rows, ws_rows, as_rows, row_ok_m,
                w_cur, w_next_buf, rmax, acc, s_next, xs, MMA: gl.constexpr, P_W: gl.constexpr,
                W_WORDS: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RING: gl.constexpr):
    """Chunk k of the SWAP_AB 0 kernel, one wait and two CTA barriers (one here, one the compiler adds for
    the ring's cp.async writes and the wgmma's read of it): the copies of chunk k + RING - 1 go out
    before anything async reads the ring, the wgmma of chunk k runs under the decode of chunk k + 1 into the
    other buffer (a separate allocation, so no barrier between them), the next activation scales are loaded
    a chunk ahead."""
    cp.wait_group(RING - 3)  # chunk k's activations, chunk k + 1's packed weights (mine)
    _barrier()  # everyone's; chunk k's decoded weights (stored and fenced last trip); chunk k - 1's slots
    kn = gl.minimum(k + RING - 1, num_k - 1)
    _async_load(x_ring.index((k + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
                mask=row_ok_x[:, None])
    _async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
    cp.commit_group()
    part = warpgroup_mma(x_ring.index(k % RING), w_cur.permute((1, 0)),
                         gl.zeros([BM, BN], gl.float32, MMA), use_acc=False, is_async=True)
    w_next = _decode_words(w_ring.index((k + 1) % RING).load(P_W), s_next, rmax, BN)
    _store_words(w_next_buf, w_next, W_WORDS, BN)
    fence_async_shared()
    s_next = gl.load(ws_rows + gl.minimum(k + 2, num_k - 1) * (CHUNK // 32)).to(gl.int32)
    xs_next = gl.load(as_rows + gl.minimum(k + 1, num_k - 1), mask=row_ok_m, other=0.0)
    part, w_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, w_next])
    acc += part * xs[:, None]
    return acc, s_next, xs_next


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_smem_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr,
                          num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm, stride_we,
                          stride_wn, stride_wse, stride_wsn, stride_cm, GROUP_SIZE_M, A_DIV: gl.constexpr,
                          GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                          RING: gl.constexpr, SCALE_RING: gl.constexpr, num_warps: gl.constexpr):
    """SWAP_AB 0: the activations are the wgmma's M side (BLOCK_SIZE_M / 64 warpgroups, both operands from
    shared memory) and every thread decodes a share of each weight chunk into a shared buffer that all of
    the CTA's warpgroups read: at high density one decode serves BLOCK_SIZE_M rows without the accumulator
    registers that cap the SWAP_AB 1 kernel's M tile. Chunk k+1 is decoded while chunk k multiplies.
    SCALE_RING 1: the activation scales through the ring and a loop that costs four CTA barriers a chunk
    (the first version, faster for down's 8 chunks on the H200); 0: two a chunk (1.08-1.15x for
    gate/up's 32, results/fp4_prefill.md, session 17). Needs num_stages >= 2 with SCALE_RING 0."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_n = _tile_ids(N, num_blocks, GROUP_SIZE_M, BN)
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

    w_rows, ws_rows = _weight_rows(w_ptr, w_scale_ptr, expert, pid_n, stride_we, stride_wn, stride_wse,
                                   stride_wsn, P_W, BN)

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
    _fill_ring(x_ring, w_ring, xs_ring if SCALE_RING else x_ring, num_k, x_rows, cols_x, row_ok_x, w_rows,
               xs_src, row_ok_s, True, RING, SCALE_RING, False)
    rmax = _row_max_scale(ws_rows, num_k, S2, BN)

    cp.wait_group(RING - 2)
    w0 = _decode_words(w_ring.index(0).load(P_W), gl.load(ws_rows).to(gl.int32), rmax, BN)
    acc = gl.zeros([BM, BN], gl.float32, MMA)
    if SCALE_RING:  # a CTA barrier for each shared-memory hazard (four a chunk); fewer instructions a chunk
        _store_words(w_dec.index(0), w0, W_WORDS, BN)
        s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
        for k in range(num_k):
            cp.wait_group(RING - 2)  # chunk k's copies (mine), then everyone's, and the decoded chunk k
            fence_async_shared()
            _barrier()
            xs = xs_ring.index(k % RING).load(gl.SliceLayout(1, MMA))
            part = warpgroup_mma(x_ring.index(k % RING), w_dec.index(k % 2).permute((1, 0)),
                                 gl.zeros([BM, BN], gl.float32, MMA), use_acc=False, is_async=True)
            # the slots chunk k - 1 used are free: every warpgroup waited for its wgmma before the barrier
            kn = gl.minimum(k + RING - 1, num_k - 1)
            _async_load(x_ring.index((k + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
                        mask=row_ok_x[:, None])
            _async_load(w_ring.index((k + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
            _async_load(xs_ring.index((k + RING - 1) % RING), xs_src + kn, mask=row_ok_s)
            cp.commit_group()
            cp.wait_group(RING - 2)  # chunk k + 1's packed weights: the 16 bytes each thread copied itself
            w_next = _decode_words(w_ring.index((k + 1) % RING).load(P_W), s_next, rmax, BN)
            _store_words(w_dec.index((k + 1) % 2), w_next, W_WORDS, BN)
            s_next = gl.load(ws_rows + gl.minimum(k + 2, num_k - 1) * (CHUNK // 32)).to(gl.int32)
            part, w_next = warpgroup_mma_wait(num_outstanding=0, deps=[part, w_next])
            acc += part * xs[:, None]
    else:  # one wait and two CTA barriers a chunk
        _store_words(w_even, w0, W_WORDS, BN)
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
    gl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=(route_c < routes)[:, None])


@gluon.jit
def _half(dec, c, h: gl.constexpr, BN: gl.constexpr):
    """Half h of chunk c's decoded weights as the wgmma's B operand [CHUNK, BN / 2]."""
    return dec.index(c % 3).slice(h * (BN // 2), BN // 2).permute((1, 0))


@gluon.jit
def _decode_into(dec, c, w_ring, s, rmax, P_W: gl.constexpr, W_WORDS: gl.constexpr, BN: gl.constexpr,
                 RING: gl.constexpr):
    """Chunk c's packed weights (ring) into its decoded buffer, fenced for the wgmma."""
    _store_words(dec.index(c % 3), _decode_words(w_ring.index(c % RING).load(P_W), s, rmax, BN), W_WORDS, BN)
    fence_async_shared()


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_halves_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr,
                            num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm, stride_we,
                            stride_wn, stride_wse, stride_wsn, stride_cm, GROUP_SIZE_M, A_DIV: gl.constexpr,
                            GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                            RING: gl.constexpr, num_warps: gl.constexpr):
    """SWAP_AB 0, SCALE_RING 0, ``MMA_HALVES``: each chunk's wgmma in two N halves, and the next chunk's first
    half issued before this one's second half is rescaled, so the tensor cores have the next product queued
    while the accumulator takes the last one (``fp4_wgmma_smem_kernel`` waits for the whole product, then
    rescales, then meets the barrier, with the tensor cores idle). Three decoded buffers (chunk c + 1 is
    decoded while halves of chunks c and c + 1 may still read theirs); copies land two chunks before their
    weights are decoded, so num_stages >= 3."""
    BM: gl.constexpr = BLOCK_SIZE_M
    BN: gl.constexpr = BLOCK_SIZE_N
    pid_m, pid_n = _tile_ids(N, num_blocks, GROUP_SIZE_M, BN)
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
    w_rows, ws_rows = _weight_rows(w_ptr, w_scale_ptr, expert, pid_n, stride_we, stride_wn, stride_wse,
                                   stride_wsn, P_W, BN)
    x_rows, row_ok_x, xs_src, row_ok_s, route_s = _block_rows(
        pid_m, sorted_ids_ptr, a_ptr, a_scale_ptr, routes, stride_am, stride_asm, A_DIV, GATHERED, X_LOAD,
        gl.SliceLayout(1, MMA_H), BM)
    cols_x = gl.arange(0, CHUNK, gl.SliceLayout(0, X_LOAD))

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [RING, BM, CHUNK], X_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int32, [RING, BN, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    dec = gl.allocate_shared_memory(gl.float8e4nv, [3, BN, CHUNK], W_SMEM)
    num_k = K // CHUNK
    _fill_ring(x_ring, w_ring, x_ring, num_k, x_rows, cols_x, row_ok_x, w_rows, xs_src, row_ok_s, True, RING,
               False, False)
    rmax = _row_max_scale(ws_rows, num_k, S2, BN)
    cp.wait_group(RING - 3)  # chunks 0 and 1 (mine)
    _decode_into(dec, 0, w_ring, gl.load(ws_rows).to(gl.int32), rmax, P_W, W_WORDS, BN, RING)
    s_next = gl.load(ws_rows + CHUNK // 32).to(gl.int32)
    xs = gl.load(xs_src, mask=row_ok_s, other=0.0)
    _barrier()
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
        _barrier()  # everyone's: chunk c + 1 decoded; chunk c - 1's slots read by both its halves
        kn = gl.minimum(c + RING - 1, num_k - 1)
        _async_load(x_ring.index((c + RING - 1) % RING), x_rows + kn * CHUNK + cols_x[None, :],
                    mask=row_ok_x[:, None])
        _async_load(w_ring.index((c + RING - 1) % RING), w_rows + kn * (CHUNK // 8))
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
        gl.store(c_ptrs, (acc * wf_h[None, :]).to(c_ptr.dtype.element_ty), mask=ok)


@gluon.jit
def _ws_tile(t, N, blocks, GROUP_SIZE_M, expert_ids_ptr, BN: gl.constexpr):
    """Tile t of a persistent program: its (M-block, N-tile) and expert (int32: nothing waits for the load
    until the expert is used)."""
    pid_m, pid_n = _tile_of(t, N, blocks, GROUP_SIZE_M, BN)
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
def _x_slot(x_buf, c, k, NBUF: gl.constexpr, A_RESIDENT: gl.constexpr):
    """The activation buffer of chunk c (k within its tile): the ring's slot, or the resident chunk k."""
    slot = c % NBUF
    if A_RESIDENT:
        slot = k
    return x_buf.index(slot)


@gluon.jit
def _x_copy(x_buf, c, k, x_rows, cols_x, row_ok_x, fresh, NBUF: gl.constexpr, A_RESIDENT: gl.constexpr):
    """Chunk k's activations into their buffer; resident ones only for a tile of a new M-block (``fresh``):
    a masked copy would still write the buffer (zeros)."""
    if A_RESIDENT:
        if fresh:
            _async_load(x_buf.index(k), x_rows + k * CHUNK + cols_x[None, :], mask=row_ok_x[:, None])
    else:
        _async_load(x_buf.index(c % NBUF), x_rows + k * CHUNK + cols_x[None, :], mask=row_ok_x[:, None])


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


@gluon.jit
def _ws_mma(x_buf, dec, rbuf, out_smem, ready, empty, a_scale_ptr, c_ptr, sorted_ids_ptr, num_tiles, blocks,
            N, K, routes, GROUP_SIZE_M, stride_asm, stride_cm, A_DIV: gl.constexpr,
            GATHERED: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, NBUF: gl.constexpr,
            A_RESIDENT: gl.constexpr, num_warps: gl.constexpr):
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
    pid_m, pid_n = _tile_of(first, N, blocks, GROUP_SIZE_M, BN)
    route = _ws_routes(pid_m, sorted_ids_ptr, ROWS, BM)
    xs_src = _ws_row_ptrs(route, pid_m, a_scale_ptr, routes, stride_asm, A_DIV, GATHERED, ROWS, BM)
    xs = gl.load(xs_src, mask=route < routes, other=0.0)
    pid_m_n, pid_n_n = _tile_of(gl.minimum(first + step, num_tiles - 1), N, blocks, GROUP_SIZE_M, BN)
    route_n = _ws_routes(pid_m_n, sorted_ids_ptr, ROWS, BM)
    zero = gl.zeros([BM, BN], gl.float32, MMA)
    rmax = gl.zeros([BN], gl.int32, gl.SliceLayout(0, MMA))
    g = 0
    ti = 0
    for t in range(first, stop, step):
        # (past the last tile: a real one, never stored)
        pid_m_nn, pid_n_nn = _tile_of(gl.minimum(t + 2 * step, num_tiles - 1), N, blocks, GROUP_SIZE_M, BN)
        route_nn = _ws_routes(pid_m_nn, sorted_ids_ptr, ROWS, BM)  # used a tile from now
        xs_src_n = _ws_row_ptrs(route_n, pid_m_n, a_scale_ptr, routes, stride_asm, A_DIV, GATHERED, ROWS,
                                BM)
        acc = zero
        for k in range(num_k):
            c = g + k
            mbarrier.wait(ready.index(c % NBUF), (c // NBUF) & 1)
            part = warpgroup_mma(_x_slot(x_buf, c, k, NBUF, A_RESIDENT), dec.index(c % NBUF).permute((1, 0)),
                                 zero, use_acc=False, is_async=True)
            if k == 0:  # this tile's row max scales, written by the decode partition before its first ready
                rmax = rbuf.index(ti % 2).load(gl.SliceLayout(0, MMA))
            last = k + 1 == num_k
            xs_next = gl.load(gl.where(last, xs_src_n, xs_src + k + 1),
                              mask=gl.where(last, route_n, route) < routes, other=0.0)
            part = warpgroup_mma_wait(num_outstanding=0, deps=[part])
            _barrier()  # the MMA warpgroups' products (the arrive is one thread's)
            mbarrier.arrive(empty.index(c % NBUF), count=1)
            acc += part * xs[:, None]
            xs = xs_next
        wf = ((rmax - 1) << 23).to(gl.float32, bitcast=True)  # 2^(rmax - 128)
        # through shared memory, so each warp stores whole rows (16 B a thread) instead of 32-byte pieces
        # of eight rows (a warp's next read of out_smem is past this tile's chunk barriers)
        out_smem.store((acc * wf[None, :]).to(c_ptr.dtype.element_ty))
        _barrier()
        n_c = pid_n * BN + gl.arange(0, BN, gl.SliceLayout(0, OUT_L))
        row = gl.convert_layout(route, gl.SliceLayout(1, OUT_L))
        c_ptrs = c_ptr + row.to(gl.int64)[:, None] * stride_cm + n_c[None, :]
        gl.store(c_ptrs, out_smem.load(OUT_L), mask=(row < routes)[:, None])
        pid_m_n, pid_n, pid_n_n = pid_m_nn, pid_n_n, pid_n_nn
        route, route_n = route_n, route_nn
        xs_src = xs_src_n
        g += num_k
        ti += 1


@gluon.jit
def _ws_decode(x_buf, w_ring, dec, rbuf, ready, empty, a_ptr, w_ptr, w_scale_ptr, sorted_ids_ptr,
               expert_ids_ptr, num_tiles, blocks, N, K, routes, GROUP_SIZE_M, stride_am, stride_we, stride_wn,
               stride_wse, stride_wsn, A_DIV: gl.constexpr, GATHERED: gl.constexpr, BM: gl.constexpr,
               BN: gl.constexpr, NBUF: gl.constexpr, LOOK: gl.constexpr, DW: gl.constexpr,
               A_RESIDENT: gl.constexpr):
    """DECODE_WARPS' worker partition (DW warps), over the program's tiles: copies (activations into the
    shared slots, packed weights into its own ring, LOOK chunks ahead within a tile, each slot taken once
    ``empty`` says its last product is done), the tile's row max scales into ``rbuf`` (loaded while its
    first copies fly), and the decode of each chunk into the slot's weight buffer, then ``ready``. It runs up
    to NBUF chunks ahead of the MMA warps. The next tile's expert and route ids are loaded a tile ahead."""
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
    pid_m, pid_n, expert = _ws_tile(first, N, blocks, GROUP_SIZE_M, expert_ids_ptr, BN)
    route = _ws_routes(pid_m, sorted_ids_ptr, X_ROWS, BM)
    g = 0
    ti = 0
    held = -1  # the M-block whose activations are resident
    for t in range(first, stop, step):
        pid_m_n, pid_n_n, expert_n = _ws_tile(gl.minimum(t + step, num_tiles - 1), N, blocks, GROUP_SIZE_M,
                                              expert_ids_ptr, BN)
        route_n = _ws_routes(pid_m_n, sorted_ids_ptr, X_ROWS, BM)  # used a tile from now
        w_rows, ws_rows = _weight_rows(w_ptr, w_scale_ptr, expert.to(gl.int64), pid_n, stride_we, stride_wn,
                                       stride_wse, stride_wsn, P_W, BN)
        x_rows = _ws_row_ptrs(route, pid_m, a_ptr, routes, stride_am, A_DIV, GATHERED, X_ROWS, BM)[:, None]
        row_ok_x = route < routes
        fresh = pid_m != held
        held = pid_m
        for i in gl.static_range(LOOK):
            c = g + i
            # the slot's last product done (resident: chunk i of the last tile too, as NBUF <= num_k)
            mbarrier.wait(empty.index(c % NBUF), ((c // NBUF) & 1) ^ 1)
            kn = gl.minimum(i, num_k - 1)
            _x_copy(x_buf, c, kn, x_rows, cols_x, row_ok_x, fresh, NBUF, A_RESIDENT)
            _async_load(w_ring.index(c % LOOK), w_rows + kn * (CHUNK // 8))
            cp.commit_group()
        rmax = _row_max_scale(ws_rows, num_k, S2, BN)
        rbuf.index(ti % 2).store(gl.convert_layout(gl.reshape(rmax, [BN]), R_L))
        s = gl.load(ws_rows).to(gl.int32)
        for k in range(num_k):
            c = g + k
            cp.wait_group(LOOK - 1)  # chunk k (mine)
            words = w_ring.index(c % LOOK).load(P_W)
            s_next = gl.load(ws_rows + gl.minimum(k + 1, num_k - 1) * (CHUNK // 32)).to(gl.int32)
            _store_words(dec.index(c % NBUF), _decode_words(words, s, rmax, BN), W_WORDS, BN)
            fence_async_shared()
            _barrier()  # the partition's copies landed and decodes stored (the arrive is one thread's)
            mbarrier.arrive(ready.index(c % NBUF), count=1)
            if k + LOOK < num_k:  # the copies of chunk k + LOOK of this tile
                cn = c + LOOK
                mbarrier.wait(empty.index(cn % NBUF), ((cn // NBUF) & 1) ^ 1)
                _x_copy(x_buf, cn, k + LOOK, x_rows, cols_x, row_ok_x, fresh, NBUF, A_RESIDENT)
                _async_load(w_ring.index(cn % LOOK), w_rows + (k + LOOK) * (CHUNK // 8))
            cp.commit_group()  # (empty past the tile's last chunk: the wait above counts groups)
            s = s_next
        pid_m, pid_n, expert, route = pid_m_n, pid_n_n, expert_n, route_n
        g += num_k
        ti += 1
    cp.wait_group(0)


@gluon.jit(do_not_specialize=["num_blocks", "GROUP_SIZE_M"])
def fp4_wgmma_ws_kernel(a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr,
                        num_padded_ptr, N, K, routes, num_blocks, stride_am, stride_asm, stride_we, stride_wn,
                        stride_wse, stride_wsn, stride_cm, GROUP_SIZE_M, A_DIV: gl.constexpr,
                        GATHERED: gl.constexpr, BLOCK_SIZE_M: gl.constexpr, BLOCK_SIZE_N: gl.constexpr,
                        RING: gl.constexpr, DECODE_WARPS: gl.constexpr, DECODE_REGS: gl.constexpr,
                        A_RESIDENT: gl.constexpr, X_SLOTS: gl.constexpr, num_warps: gl.constexpr):
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
    num_tiles = blocks * (N // BN)
    first, stop, step = _ws_range(num_tiles, A_RESIDENT)
    if first >= stop:
        return
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, CHUNK], gl.float8e4nv)
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, CHUNK], gl.float8e4nv)
    x_buf = gl.allocate_shared_memory(gl.float8e4nv, [X_SLOTS, BM, CHUNK], X_SMEM)
    dec = gl.allocate_shared_memory(gl.float8e4nv, [RING, BN, CHUNK], W_SMEM)
    w_ring = gl.allocate_shared_memory(gl.int32, [RING - 1, BN, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
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
    _barrier()
    gl.warp_specialize([
        (_ws_mma, (x_buf, dec, rbuf, out_smem, ready, empty, a_scale_ptr, c_ptr, sorted_ids_ptr, num_tiles,
                   blocks, N, K, routes, GROUP_SIZE_M, stride_asm, stride_cm, A_DIV, GATHERED, BM,
                   BN, RING, A_RESIDENT, num_warps)),
        (_ws_decode, (x_buf, w_ring, dec, rbuf, ready, empty, a_ptr, w_ptr, w_scale_ptr, sorted_ids_ptr,
                      expert_ids_ptr, num_tiles, blocks, N, K, routes, GROUP_SIZE_M, stride_am, stride_we,
                      stride_wn, stride_wse, stride_wsn, A_DIV, GATHERED, BM, BN, RING, RING - 1,
                      DECODE_WARPS, A_RESIDENT)),
    ], [DECODE_WARPS], [DECODE_REGS])


# registers a thread of DECODE_WARPS' partition (the MMA warps get the rest of maxnreg's pool), by decode
# warps and OUT_DTYPE. With 4 and fp32 rows, 136: offline (Triton 3.6, BM128 BN128) no spill in the decode
# partition and a dozen outside the MMA warps' chunk loop; on the H200 down 24576 0.594 ms against 0.620 with
# 120 (results/lut_s19, call 6). With bf16 rows, 120: 0.543 ms (A_RESIDENT 0.506) against 0.552 (0.526)
# with 136, 0.587 (0.517) with 112 (results/lut_s20, call 5). With 8, 72.
_DECODE_REGS = {(4, "fp32"): 136, (4, "bf16"): 120, (8, "fp32"): 72, (8, "bf16"): 72}


def _maxnreg(config) -> dict:
    """Registers capped for the small SWAP_AB tiles (up to 32 x 64), where the cap costs no spill: at 168
    three CTAs an SM instead of two, 12% faster at 6144 routes on the H200 (results/fp4_prefill.md, session
    16); with SCALE_RING at 128, four CTAs (136 registers uncapped, no spill at 128 offline). A config's
    MAXNREG (SWAP_AB 1) instead: 96 gives 4-warp programs five CTAs an SM (the 16 x 64 tile with SCALE_RING
    and three stages compiles to it without a spill offline; larger ones spill)."""
    if config.get("MAXNREG"):
        return {"maxnreg": config["MAXNREG"]}
    if not config.get("SWAP_AB", 1) or config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"] > 32 * 64:
        return {}
    return {"maxnreg": 128 if config.get("SCALE_RING") else 168}


def _kernel(config, a_div: int, gathered: bool, k: int, n: int):
    """The kernel a config runs (SWAP_AB: weights as the wgmma's M side, in registers; else through shared
    memory; MMA_HALVES: that one with each chunk's product in two halves), its constexpr arguments and launch
    options."""
    const = dict(A_DIV=a_div, GATHERED=gathered, BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
                 BLOCK_SIZE_N=config["BLOCK_SIZE_N"], RING=config["num_stages"] + 1,
                 num_warps=config["num_warps"])
    if config.get("MMA_HALVES", 0):
        return fp4_wgmma_halves_kernel, const, {}
    if config.get("DECODE_WARPS", 0):  # more warps that decode; the register file split over all of them
        dw = config["DECODE_WARPS"]
        resident = bool(config.get("A_RESIDENT", 0))
        regs = _DECODE_REGS[dw, config.get("OUT_DTYPE", "fp32")]
        const.update(DECODE_WARPS=dw, DECODE_REGS=regs, A_RESIDENT=resident,
                     X_SLOTS=k // 128 if resident else const["RING"])
        threads = 32 * (config["num_warps"] + dw)
        return fp4_wgmma_ws_kernel, const, {"maxnreg": min(255, 65536 // threads) // 8 * 8}
    const["SCALE_RING"] = bool(config.get("SCALE_RING", 0))
    if not config.get("SWAP_AB", 1):
        return fp4_wgmma_smem_kernel, const, {}
    resident = bool(config.get("A_RESIDENT", 0))
    tiles = resident_n_tiles(n, config["BLOCK_SIZE_N"]) if resident else 1
    const.update(A_RESIDENT=resident, X_SLOTS=k // 128 if resident else const["RING"], N_TILES=tiles)
    const["RING_SPLIT"] = bool(config.get("RING_SPLIT", 0))
    return fp4_wgmma_kernel, const, _maxnreg(config)


# N tiles a SWAP_AB 1 program takes with A_RESIDENT (fewer where N / BLOCK_SIZE_N does not divide)
RESIDENT_N_TILES = 4


def resident_n_tiles(n: int, bn: int) -> int:
    tiles = RESIDENT_N_TILES
    while (n // bn) % tiles:
        tiles //= 2
    return tiles


def compile_for_sm90(config, *, a_div: int = 6, gathered: bool = False, k: int = 1024, n: int = 4096,
                     out_dtype: str = "fp32", maxnreg: int | None = None):
    """The kernel for ``config`` compiled for sm_90 without a GPU (the launcher's specializations; K and N,
    which only A_RESIDENT specializes on, and the per-route output's dtype, "fp32" or "bf16"), for resource
    reports and the CPU suite's check of the installed Triton; ``maxnreg`` instead of the launcher's register
    cap. Not under TRITON_INTERPRET."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel, const, options = _kernel(config, a_div, gathered, k, n)
    if maxnreg:
        options = {**options, "maxnreg": maxnreg}
    params = list(inspect.signature(kernel.fn).parameters)
    types = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "w_ptr": "*i32", "w_scale_ptr": "*u8",
             "c_ptr": "*" + out_dtype, "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
             "num_padded_ptr": "*i32"}
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    aligned = [p for p in params if p not in const
               and (p.startswith("stride") or p in ("N", "K") or p.endswith("_ptr"))]
    src = GluonASTSource(kernel, sig, constexprs={(params.index(k),): v for k, v in const.items()},
                         attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": const["num_warps"],
                                                                           **options})


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_problem(k: int, w: torch.Tensor, config) -> None:
    """ValueError, before anything is launched, for what this kernel cannot run: no CUDA GPU, SWAP_AB 0
    SCALE_RING 0 with one stage or a 256-row M tile, K not a multiple of 256 or N of BLOCK_SIZE_N, packed
    weights not readable as aligned 16-byte words."""
    if interpreter_active() or not w.is_cuda:
        raise ValueError("config IMPL 'gluon' runs on an sm_90 CUDA GPU only (Gluon has no interpreter)")
    bn, n = config["BLOCK_SIZE_N"], w.shape[1]
    if config.get("MMA_HALVES", 0) and (config["num_stages"] < 3 or config["BLOCK_SIZE_N"] < 32):
        raise ValueError(f"config IMPL 'gluon' with MMA_HALVES needs num_stages >= 3 and BLOCK_SIZE_N >= 32, "
                         f"got {config['num_stages']} and {config['BLOCK_SIZE_N']}")
    if not config.get("SWAP_AB", 1) and not config.get("SCALE_RING", 0):
        if config["num_stages"] < 2:
            raise ValueError("config IMPL 'gluon' with SWAP_AB 0 and SCALE_RING 0 needs num_stages >= 2 (one "
                             "wait covers a chunk's activations and the next chunk's weights), got "
                             f"{config['num_stages']}")
        if config["BLOCK_SIZE_M"] > 128:  # not understood yet: SCALE_RING 1 runs it (results/fp4_prefill.md)
            raise ValueError("config IMPL 'gluon' with SWAP_AB 0 and SCALE_RING 0 runs BLOCK_SIZE_M <= 128 "
                             f"(256 stopped on a misaligned address on the H200), got "
                             f"{config['BLOCK_SIZE_M']}")
    if config.get("A_RESIDENT", 0):
        from moetune.kernels.fp4_prefill.config import smem_bytes

        smem = smem_bytes(config, k)
        limit = torch.cuda.get_device_properties(w.device).shared_memory_per_block_optin
        if k // 128 < config["num_stages"] + 1 or smem > limit:
            raise ValueError(f"config A_RESIDENT holds K / 128 = {k // 128} activation chunks: needs at "
                             f"least num_stages + 1 = {config['num_stages'] + 1} and ~{smem} bytes of shared "
                             f"memory within the device's {limit}")
    if k % 256 or n % bn:
        raise ValueError(f"config IMPL 'gluon' needs K a multiple of 256 and N of BLOCK_SIZE_N {bn}, "
                         f"got K {k}, N {n}")
    if w.stride(2) != 1 or any(s % 4 for s in w.stride()[:2]) or w.data_ptr() % 16:
        raise ValueError(f"config IMPL 'gluon' reads the packed weights as 16-byte words: unit stride along "
                         f"K, strides a multiple of 4 and a 16-byte aligned base, got strides {w.stride()}")


def launch(a, a_scale, w, w_scale, out, align, *, a_div: int, gathered: bool, config,
           a_k_order: str = "real") -> None:
    """As ``fp4_gemm.launch``, for a config with IMPL "gluon"; ``a`` in real K order is permuted here (a copy
    of ``a``), in the wgmma order it is read as it is."""
    check_problem(a.shape[1], w, config)
    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    if align.block_m != bm:
        raise ValueError(f"alignment was made for BLOCK_SIZE_M {align.block_m}, config has {bm}")
    n, k = w.shape[1], a.shape[1]
    if a_k_order == "real":
        a = to_wgmma_k_order(a)
    elif a_k_order != "wgmma" or a.stride(1) != 1:
        raise ValueError(f"a_k_order must be 'real' or 'wgmma' (then a contiguous along K), got "
                         f"{a_k_order!r} with strides {a.stride()}")
    words = w.view(torch.int32)
    kernel, const, options = _kernel(config, a_div, gathered, k, n)
    grid = align.max_blocks * (n // (bn * const.get("N_TILES", 1)))
    if config.get("DECODE_WARPS", 0):  # persistent: a program an SM
        grid = min(grid, _sm_count(a.device))
    kernel[(grid,)](
        a, a_scale, words, w_scale, out, align.sorted_ids, align.expert_ids, align.num_padded, n, k,
        align.routes, align.max_blocks, a.stride(0), a_scale.stride(0), words.stride(0), words.stride(1),
        w_scale.stride(0), w_scale.stride(1), out.stride(0), config["GROUP_SIZE_M"], **const, **options)
