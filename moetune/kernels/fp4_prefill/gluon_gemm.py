"""The FP4 grouped GEMM in Gluon for sm_90 (config ``IMPL "gluon"``): the launcher and the choice of kernel.

Same numbers as ``triton_gemm`` with ``DECODE fp8_row``, ``UNPACK lut`` and 128-K chunks: weights re-based on
their row's largest scale (exact while a row's scales differ by at most 9), one fp8 wgmma per chunk into a
fresh accumulator, ``acc += part * x_scale`` per chunk, the row factor ``2^(rmax - 128)`` at the end.
``tl.dot`` waits for every wgmma whose operand the loop made in registers before the next step starts;
these kernels issue the wgmma async and decode the next chunk under it. Gluon pipelines nothing: the packed
weights and activations of chunk ``k + num_stages`` are copied (cp.async) into rings of ``num_stages + 1``
slots while chunk k multiplies.

K order. The wgmma A fragment (the decoded weights, registers) gives lane ``q = lane % 4`` the K runs
``4q..4q+3`` and ``16+4q..16+4q+3`` of every 32. The order inside a 128-K chunk is free if the activations
follow it, so thread q takes the whole 32-K scale group q of each of its rows: logical ``32b + 16h + 4q + i``
is real ``32q + 8b + 4h + i``. A thread loads its group's 16 packed bytes as one vector, makes the group's
e4m3 pool once and turns each 4-byte word (b) into the two registers (h) the wgmma reads, with no data
movement between threads (``assert_trivial`` checks it). The activations come in that order, written so by
their producers (``quantize_fp8_act(k_order="wgmma")``, the swiglu quantizer) or permuted here
(``moetune.quant.fp8_act.to_wgmma_k_order``); their 128-K scales do not move.

The kernels, by config (``_kernel``):

- SWAP_AB 1: ``gluon_ring.fp4_wgmma_kernel``, the weights as the wgmma's M side in registers (SCALE_RING,
  A_RESIDENT over ``resident_n_tiles`` N tiles, RING_SPLIT; MAXNREG sets its register cap).
- SWAP_AB 0: ``gluon_smem.fp4_wgmma_smem_kernel``, the weights decoded into shared memory (SCALE_RING);
  with MMA_HALVES ``gluon_smem.fp4_wgmma_halves_kernel``; with DECODE_WARPS 4 or 8 the persistent,
  warp-specialized ``gluon_ws.fp4_wgmma_ws_kernel`` (A_RESIDENT over a program's run of tiles; W_TMA its
  packed weights by TMA copies).

Each weight row's largest scale code (the fp8 re-basing's) is read from ``w_smax`` where the layer is
given it (``moetune.quant.scale_row_max``), else each tile makes a pass over its scales first.

Any N: where BLOCK_SIZE_N does not divide it, the last N tile is a tail (constexpr ``EVEN_N`` False; its
weight rows past N read row N - 1, its columns past N are not stored: ``gluon_common.tile_rows``,
``store_mask``). K must be a multiple of 256 (``moetune.quant.pad_mxfp4_k`` pads weights once at load).

What each switch is worth: docs/kernels/fp4_prefill.md, under the switch's name. GPU only: Gluon has no
interpreter; ``compile_for_sm90`` compiles a config's kernel offline for the CPU suite.
"""

from __future__ import annotations

import functools

import torch

from moetune.device import interpreter_active
from moetune.kernels.fp4_prefill.gluon_ring import fp4_wgmma_kernel
from moetune.kernels.fp4_prefill.gluon_smem import fp4_wgmma_halves_kernel, fp4_wgmma_smem_kernel
from moetune.kernels.fp4_prefill.gluon_ws import fp4_wgmma_ws_kernel
from moetune.quant.fp8_act import to_wgmma_k_order

# Registers a thread of DECODE_WARPS' partition (the MMA warps get the rest of maxnreg's pool), by decode
# warps and OUT_DTYPE: the fastest of the values timed (docs/kernels/fp4_prefill.md, DECODE_WARPS). With 4
# warps and fp32 rows, 136 leaves the decode partition without a spill at BM128 BN128.
_DECODE_REGS = {(4, "fp32"): 136, (4, "bf16"): 120, (8, "fp32"): 72, (8, "bf16"): 72}


def _maxnreg(config) -> dict:
    """Registers capped for the small SWAP_AB tiles (up to 32 x 64), where the cap costs no spill: 168 fits
    three CTAs an SM instead of two; with SCALE_RING 128 (uncapped 136), four. A config's MAXNREG (SWAP_AB
    1) instead: 96 gives 4-warp programs five CTAs an SM (the 16 x 64 tile with SCALE_RING and three stages
    fits it without a spill; larger ones spill). See docs/kernels/fp4_prefill.md, MAXNREG."""
    if config.get("MAXNREG"):
        return {"maxnreg": config["MAXNREG"]}
    if not config.get("SWAP_AB", 1) or config["BLOCK_SIZE_M"] * config["BLOCK_SIZE_N"] > 32 * 64:
        return {}
    return {"maxnreg": 128 if config.get("SCALE_RING") else 168}


def _kernel(config, a_div: int, gathered: bool, k: int, n: int):
    """The kernel a config runs (SWAP_AB: weights as the wgmma's M side, in registers; else through shared
    memory; MMA_HALVES: that one with each chunk's product in two halves), its constexpr arguments and launch
    options. EVEN_N: N a multiple of BLOCK_SIZE_N; else the last N tile is a masked tail, and only that
    specialization pays for the clamps and masks."""
    const = dict(A_DIV=a_div, GATHERED=gathered, BLOCK_SIZE_M=config["BLOCK_SIZE_M"],
                 BLOCK_SIZE_N=config["BLOCK_SIZE_N"], RING=config["num_stages"] + 1,
                 num_warps=config["num_warps"], EVEN_N=n % config["BLOCK_SIZE_N"] == 0)
    if config.get("MMA_HALVES", 0):
        return fp4_wgmma_halves_kernel, const, {}
    if config.get("DECODE_WARPS", 0):  # more warps that decode; the register file split over all of them
        dw = config["DECODE_WARPS"]
        resident = bool(config.get("A_RESIDENT", 0))
        regs = _DECODE_REGS[dw, config.get("OUT_DTYPE", "fp32")]
        const.update(DECODE_WARPS=dw, DECODE_REGS=regs, A_RESIDENT=resident,
                     X_SLOTS=k // 128 if resident else const["RING"], W_TMA=bool(config.get("W_TMA", 0)))
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


# N tiles a SWAP_AB 1 program takes with A_RESIDENT (fewer where the N tiles, a tail tile counted, do not
# divide by it)
RESIDENT_N_TILES = 4


def n_tiles(n: int, bn: int) -> int:
    """N tiles of ``bn`` over ``n``, the last one a tail where ``bn`` does not divide ``n``."""
    return -(-n // bn)


def resident_n_tiles(n: int, bn: int) -> int:
    tiles = RESIDENT_N_TILES
    while n_tiles(n, bn) % tiles:
        tiles //= 2
    return tiles


def compile_for_sm90(config, *, a_div: int = 6, gathered: bool = False, k: int = 1024, n: int = 4096,
                     out_dtype: str = "fp32", maxnreg: int | None = None, row_max: bool = False):
    """The kernel for ``config`` compiled for sm_90 without a GPU (the launcher's specializations; K, which
    only A_RESIDENT specializes on, N, whose tail tile EVEN_N says, the per-route output's dtype, "fp32" or
    "bf16", and ``row_max``: the weights' row maxima given), for resource reports and the CPU suite's check
    of the installed Triton; ``maxnreg`` instead of the launcher's register cap. Not under
    TRITON_INTERPRET."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    kernel, const, options = _kernel(config, a_div, gathered, k, n)
    const["HAS_SMAX"] = row_max
    if maxnreg:
        options = {**options, "maxnreg": maxnreg}
    params = list(inspect.signature(kernel.fn).parameters)
    types = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "w_ptr": "*i32", "w_scale_ptr": "*u8",
             "w_smax_ptr": "*u8", "c_ptr": "*" + out_dtype, "sorted_ids_ptr": "*i32",
             "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32"}
    if "w_desc" in params:  # the warp-specialized kernel's: a TMA descriptor with W_TMA, else None
        if const["W_TMA"]:
            types["w_desc"] = mangle_type(_weight_descriptor(torch.empty(1, n, k // 8, dtype=torch.int32),
                                                             const["BLOCK_SIZE_N"]))
        else:
            const["w_desc"] = None
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    aligned = [p for p in params if p not in const
               and (p.startswith("stride") or p in ("N", "K") or p.endswith("_ptr"))]
    src = GluonASTSource(kernel, sig, constexprs={(params.index(k),): v for k, v in const.items()},
                         attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": const["num_warps"],
                                                                           **options})


def _weight_descriptor(words: torch.Tensor, bn: int):
    """The TMA descriptor of packed weights as int32 words [E, N, K / 8]: [1, BN, 16] tiles (one 128-K
    chunk of BN rows, 64 bytes a row, rows past N zero-filled), in ``gluon_ws.W_TILE``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from moetune.kernels.fp4_prefill.gluon_ws import W_TILE

    return TensorDescriptor.from_tensor(words, [1, bn, 128 // 8], W_TILE.value)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def check_problem(k: int, w: torch.Tensor, config) -> None:
    """ValueError, before anything is launched, for what this kernel cannot run: no CUDA GPU, SWAP_AB 0
    SCALE_RING 0 with one stage or a 256-row M tile, K not a multiple of 256, packed weights not readable as
    aligned 16-byte words. Any N runs: the last N tile may be a tail."""
    if interpreter_active() or not w.is_cuda:
        raise ValueError("config IMPL 'gluon' runs on an sm_90 CUDA GPU only (Gluon has no interpreter)")
    if config.get("MMA_HALVES", 0) and (config["num_stages"] < 3 or config["BLOCK_SIZE_N"] < 32):
        raise ValueError(f"config IMPL 'gluon' with MMA_HALVES needs num_stages >= 3 and BLOCK_SIZE_N >= 32, "
                         f"got {config['num_stages']} and {config['BLOCK_SIZE_N']}")
    if not config.get("SWAP_AB", 1) and not config.get("SCALE_RING", 0):
        if config["num_stages"] < 2:
            raise ValueError("config IMPL 'gluon' with SWAP_AB 0 and SCALE_RING 0 needs num_stages >= 2 (one "
                             "wait covers a chunk's activations and the next chunk's weights), got "
                             f"{config['num_stages']}")
        if config["BLOCK_SIZE_M"] > 128:  # cause unknown; SCALE_RING 1 runs these tiles
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
    if k % 256:
        raise ValueError(f"config IMPL 'gluon' needs K a multiple of 256 (moetune.quant.pad_mxfp4_k pads the "
                         f"weights once at load), got K {k}")
    if w.stride(2) != 1 or any(s % 4 for s in w.stride()[:2]) or w.data_ptr() % 16:
        raise ValueError(f"config IMPL 'gluon' reads the packed weights as 16-byte words: unit stride along "
                         f"K, strides a multiple of 4 and a 16-byte aligned base, got strides {w.stride()}")


def launch(a, a_scale, w, w_scale, out, align, *, a_div: int, gathered: bool, config,
           a_k_order: str = "real", w_smax: torch.Tensor | None = None) -> None:
    """As ``triton_gemm.launch``, for a config with IMPL "gluon"; ``a`` in real K order is permuted here (a
    copy of ``a``), in the wgmma order it is read as it is. ``w_smax [E, N]``: each weight row's largest
    scale code (``moetune.quant.scale_row_max``, checked by the layer), read instead of a pass over each
    tile's scales; None: the kernels make that pass."""
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
    grid = align.max_blocks * n_tiles(n, bn * const.get("N_TILES", 1))
    if config.get("DECODE_WARPS", 0):  # persistent: a program an SM
        grid = min(grid, _sm_count(a.device))
    smax, smax_stride = (w_scale, 0) if w_smax is None else (w_smax, w_smax.stride(0))
    if const.get("W_TMA"):
        const["w_desc"] = _weight_descriptor(words, bn)
    kernel[(grid,)](
        a, a_scale, words, w_scale, smax, out, align.sorted_ids, align.expert_ids, align.num_padded, n, k,
        align.routes, align.max_blocks, a.stride(0), a_scale.stride(0), words.stride(0), words.stride(1),
        w_scale.stride(0), w_scale.stride(1), smax_stride, out.stride(0), config["GROUP_SIZE_M"],
        HAS_SMAX=w_smax is not None, **const, **options)
