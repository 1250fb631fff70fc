"""Config rules of the FP4 grouped prefill GEMMs: the space of tiles and design switches, the shipped
default, what a config must satisfy (``normalize_config``), the constraints at a point and the density
heuristic the picker falls back to."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from moetune.device import DeviceInfo
from moetune.kernels.rules import TileRules
from moetune.problem import Config, Problem

GEMMS = ("gate_up", "down")
TILE_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
SWITCHES: dict[str, tuple[str, ...]] = {
    "DECODE": ("bf16", "fp8", "fp8_row", "f16", "fp8_scaled"),
    "UNPACK": ("join", "asm", "asm16", "halves", "lut"),
    "SWAP_AB": (0, 1),
    "A_LAYOUT": ("indexed", "gathered"),
    "W_TMA": (0, 1),
    "SCALE_AHEAD": (0, 1),
    "A_QUADS": (0, 1),
    "IMPL": ("triton", "gluon"),
    "SCALE_RING": (0, 1),
    "MMA_HALVES": (0, 1),
    "DECODE_WARPS": (0, 4, 8),
    "A_RESIDENT": (0, 1),
    "OUT_DTYPE": ("fp32", "bf16"),
    "RING_SPLIT": (0, 1),
    "MAXNREG": (0, 96),
}
# The switches only IMPL "gluon" reads, 0 with IMPL "triton" (each described in gluon_gemm.py and the kernel
# module it picks). Of the switches both IMPLs read, SWAP_AB picks the Gluon kernel: 1 the weights as the
# wgmma's M side in registers, 0 through shared memory.
GLUON_ONLY = ("SCALE_RING", "MMA_HALVES", "DECODE_WARPS", "A_RESIDENT", "RING_SPLIT", "MAXNREG")
# OUT_DTYPE, down's only, any IMPL: the per-route rows' dtype. bf16 halves the bytes the epilogue stores and
# the sum over top_k reads. Gate/up's rows stay fp32: they feed the fp8 quantizer, where a bf16 rounding first
# moves values across fp8 rounding boundaries (a few percent of error against the reference).
# What IMPL "gluon" computes: its only values of the switches it does not read.
GLUON_FIXED: dict[str, Any] = {"DECODE": "fp8_row", "UNPACK": "lut", "BLOCK_SIZE_K": 128,
                               "SCALE_AHEAD": 0, "A_QUADS": 0}
# The shipped static config: the baseline every sweep point is timed against.
DEFAULT: dict[str, Any] = {
    "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
    "num_warps": 8, "num_stages": 1, "DECODE": "bf16", "UNPACK": "join", "SWAP_AB": 0,
    "A_LAYOUT": "indexed", "W_TMA": 0, "SCALE_AHEAD": 0, "A_QUADS": 0, "IMPL": "triton", "SCALE_RING": 0,
    "MMA_HALVES": 0, "DECODE_WARPS": 0, "A_RESIDENT": 0, "OUT_DTYPE": "fp32", "RING_SPLIT": 0,
    "MAXNREG": 0,
}
SPACE: dict[str, tuple[Any, ...]] = {
    "BLOCK_SIZE_M": (16, 32, 64, 128, 256),
    "BLOCK_SIZE_N": (32, 64, 128, 256),
    "BLOCK_SIZE_K": (32, 64, 128, 256),
    "GROUP_SIZE_M": (1, 8, 16),
    "num_warps": (4, 8),
    "num_stages": (1, 2, 3),
    **SWITCHES,
}


# Largest tiles the check accepts: the space's largest (a tile past them cannot fit an SM's shared memory,
# and an absurd one must fail here, not inside a launch); GROUP_SIZE_M only orders the programs.
MAX_TILE = {"BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 256}


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def normalize_config(config: Mapping[str, Any], gemm: str = "gate_up") -> dict[str, Any]:
    """Check one GEMM's config (ValueError naming the key) and fill missing keys from the default."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config for {gemm} must be a mapping, got {type(config).__name__}")
    known = set(DEFAULT) - ({"A_LAYOUT"} if gemm == "down" else set())
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"fp4_prefill.{gemm}: unknown config key(s) {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    cfg = {k: v for k, v in DEFAULT.items() if k in known}
    cfg.update(config)
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps"):
        if not _pow2(cfg[key]):
            raise ValueError(f"config {key} must be a power of two, got {cfg[key]!r}")
    for key, most in MAX_TILE.items():
        if cfg[key] > most:
            raise ValueError(f"config {key} must be at most {most}, got {cfg[key]}")
    if cfg["BLOCK_SIZE_M"] < 16 or cfg["BLOCK_SIZE_N"] < 16:
        raise ValueError(f"config BLOCK_SIZE_M and BLOCK_SIZE_N must be >= 16 (tl.dot), got "
                         f"{cfg['BLOCK_SIZE_M']} and {cfg['BLOCK_SIZE_N']}")
    if cfg["BLOCK_SIZE_K"] % 32:
        raise ValueError(f"config BLOCK_SIZE_K must be a multiple of 32 (the scale block), "
                         f"got {cfg['BLOCK_SIZE_K']}")
    if cfg["num_warps"] > 16:
        raise ValueError(f"config num_warps must be at most 16, got {cfg['num_warps']}")
    ns = cfg["num_stages"]
    if not isinstance(ns, int) or isinstance(ns, bool) or not 1 <= ns <= 8:
        raise ValueError(f"config num_stages must be an int in [1, 8], got {ns!r}")
    for key, values in SWITCHES.items():
        if key in cfg and cfg[key] not in values:
            raise ValueError(f"config {key} must be one of {values}, got {cfg[key]!r}")
    for key in ("W_TMA", "SCALE_AHEAD", "A_QUADS", "SCALE_RING", "MMA_HALVES", "A_RESIDENT", "RING_SPLIT"):
        if cfg[key] not in (0, 1) or isinstance(cfg[key], bool):
            raise ValueError(f"config {key} must be 0 or 1, got {cfg[key]!r}")
    for key in ("DECODE_WARPS", "MAXNREG"):
        if isinstance(cfg[key], bool):
            raise ValueError(f"config {key} must be one of {SWITCHES[key]}, got {cfg[key]!r}")
    if cfg["SCALE_AHEAD"] and cfg["DECODE"] == "fp8_scaled":
        raise ValueError("config SCALE_AHEAD 1 needs a whole-chunk decode: DECODE 'fp8_scaled' loads 32-K "
                         "slices")
    if cfg["A_QUADS"] and (cfg["UNPACK"] != "lut" or cfg["BLOCK_SIZE_M"] > cfg["BLOCK_SIZE_N"]):
        raise ValueError(f"config A_QUADS 1 loads the activation halves UNPACK 'lut' splits, with "
                         f"BLOCK_SIZE_M <= BLOCK_SIZE_N; got UNPACK {cfg['UNPACK']!r}, BLOCK_SIZE_M "
                         f"{cfg['BLOCK_SIZE_M']}, BLOCK_SIZE_N {cfg['BLOCK_SIZE_N']}")
    if cfg["W_TMA"] and cfg["DECODE"] == "fp8_scaled":
        raise ValueError("config W_TMA 1 needs a whole-tile decode: DECODE 'fp8_scaled' loads 32-K slices")
    if cfg["UNPACK"] in ("halves", "lut") and cfg["BLOCK_SIZE_K"] < 64:
        raise ValueError(f"config BLOCK_SIZE_K must be >= 64 with UNPACK {cfg['UNPACK']!r} (two dots of "
                         f"K/2, fp8 dots need K >= 32), got {cfg['BLOCK_SIZE_K']}")
    if cfg["UNPACK"] == "lut" and cfg["DECODE"] not in ("fp8", "fp8_row"):
        raise ValueError(f"config UNPACK 'lut' looks up re-based e4m3 bytes: DECODE must be 'fp8' or "
                         f"'fp8_row', got {cfg['DECODE']!r}")
    if cfg["SCALE_RING"] and cfg["IMPL"] != "gluon":
        raise ValueError("config SCALE_RING 1 is a switch of IMPL 'gluon' (activation scales by cp.async)")
    if cfg["MMA_HALVES"] and (cfg["IMPL"] != "gluon" or cfg["SWAP_AB"] or cfg["SCALE_RING"]):
        raise ValueError("config MMA_HALVES 1 is a switch of IMPL 'gluon' with SWAP_AB 0 and SCALE_RING 0")
    if cfg["DECODE_WARPS"] and (cfg["IMPL"] != "gluon" or cfg["SWAP_AB"] or cfg["SCALE_RING"]
                                or cfg["MMA_HALVES"]):
        raise ValueError(f"config DECODE_WARPS {cfg['DECODE_WARPS']} is a switch of IMPL 'gluon' with "
                         f"SWAP_AB 0, SCALE_RING 0 and MMA_HALVES 0")
    if cfg["W_TMA"] and cfg["IMPL"] == "gluon" and not cfg["DECODE_WARPS"]:
        raise ValueError("config W_TMA 1 with IMPL 'gluon' is a switch of DECODE_WARPS 4 or 8 (the packed "
                         "weights by TMA copies instead of the decode warps' cp.async)")
    if gemm == "gate_up" and cfg["OUT_DTYPE"] != "fp32":
        raise ValueError(f"config OUT_DTYPE {cfg['OUT_DTYPE']!r} is down's only: gate/up's fp32 rows feed "
                         f"the fp8 quantizer, which a rounding before it would move off the reference")
    swap_gluon = cfg["IMPL"] == "gluon" and cfg["SWAP_AB"] == 1
    for key in ("RING_SPLIT", "MAXNREG"):
        if cfg[key] and not swap_gluon:
            raise ValueError(f"config {key} {cfg[key]} is a switch of IMPL 'gluon' with SWAP_AB 1; got IMPL "
                             f"{cfg['IMPL']!r}, SWAP_AB {cfg['SWAP_AB']}")
    if cfg["A_RESIDENT"] and not (swap_gluon or (cfg["DECODE_WARPS"] and cfg["GROUP_SIZE_M"] == 1)):
        raise ValueError(f"config A_RESIDENT 1 is a switch of IMPL 'gluon' with SWAP_AB 1, or of "
                         f"DECODE_WARPS 4 or 8, which runs an M-block's N tiles in a row: there GROUP_SIZE_M "
                         f"must be 1; got IMPL {cfg['IMPL']!r}, SWAP_AB {cfg['SWAP_AB']}, DECODE_WARPS "
                         f"{cfg['DECODE_WARPS']}, GROUP_SIZE_M {cfg['GROUP_SIZE_M']}")
    if cfg["IMPL"] == "gluon":
        for key, value in GLUON_FIXED.items():
            if cfg[key] != value:
                raise ValueError(f"config IMPL 'gluon' runs {key} {value!r} only, got {cfg[key]!r}")
    if cfg["DECODE"] != "bf16" and cfg["BLOCK_SIZE_K"] > 128:
        raise ValueError(f"config BLOCK_SIZE_K must be <= 128 with DECODE {cfg['DECODE']!r} "
                         f"(one activation scale per chunk), got {cfg['BLOCK_SIZE_K']}")
    return cfg


def smem_bytes(cfg: Mapping[str, Any], k: int | None = None) -> int:
    """Shared memory one program allocates, an upper bound fitted to what Triton allocates. With
    A_RESIDENT it grows with K (the M-block's whole activations): without ``k``, the ring's share.

    Fitted to ``metadata.shared`` of 146 configs across every design compiled for sm_90 (Triton 3.9)
    and to the Triton 3.6 failure (M256 N128 K256 bf16, 1 stage: 393,216 B); the table is in
    docs/kernels/fp4_prefill.md (shared memory). Terms, in bytes, with e = 1 for the fp8 decodes and 2 for
    f16/bf16 operands:

    - pipeline: (stages - 1) x the raw tiles one K step loads (A fp8 BM*BK, packed BN*BK/2, scales
      BN*BK/32, and the bf16 decode's per-element activation scales 4*BM*BK when BK > 128);
    - the MMA operands staged in shared memory: activations e*BM*BK with SWAP_AB or wgmma tiles
      (BM >= 64; 2*BM*BK at BM 256), none for mma.sync tiles; decoded weights e*BN*BK with UNPACK
      halves or lut (none with SWAP_AB: they stay in registers), else 2*BN*BK (staged as fp16);
    - the bf16 decode's scale tile 4*BM*BK when BK > 128 (what Triton 3.6 adds over 3.9);
    - 4 KiB + 8*BM*stages for the activation scales and barriers;
    - or the epilogue's layout change of the fp32 accumulator, min(4*BM*BN, 64 KiB), if larger.
    """
    bm, bn, bk, st = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"], max(1, cfg["num_stages"])
    if cfg.get("IMPL") == "gluon":  # rings of num_stages + 1 activation and packed-weight chunks
        if cfg.get("DECODE_WARPS"):  # a decoded buffer a slot, the packed-weight ring one slot shorter,
            # the output tile of the epilogue; activations a slot or (A_RESIDENT) all K / 128 chunks; the row
            # maxima and barriers (8 * BN + 1536: Triton 3.6 allocates 1340-3388 bytes over the buffers at
            # BN 64-256)
            x_slots = k // bk if cfg.get("A_RESIDENT") and k else st + 1
            out = (2 if cfg.get("OUT_DTYPE") == "bf16" else 4) * bm * bn
            return x_slots * bm * bk + (st + 1) * bn * bk + st * bn * bk // 2 + out + 8 * bn + 1536
        decoded = 3 if cfg.get("MMA_HALVES") else 2
        staged = 0 if cfg["SWAP_AB"] else decoded * bn * bk + 4 * (st + 1) * bm * cfg["SCALE_RING"]
        ring = st + 1 + (st + 1) % 2 * cfg.get("RING_SPLIT", 0)  # split: an odd ring's halves round up
        x_slots = k // bk if cfg.get("A_RESIDENT") and k else ring
        return x_slots * bm * bk + ring * bn * bk // 2 + staged + 4096
    e = 1 if cfg["DECODE"] in ("fp8", "fp8_row", "fp8_scaled") else 2
    xs = 4 * bm * bk if cfg["DECODE"] == "bf16" and bk > 128 else 0
    pipeline = (st - 1) * (bm * bk + xs + bn * bk // 2 + bn * bk // 32)
    halves, swap = cfg["UNPACK"] in ("halves", "lut"), bool(cfg.get("SWAP_AB"))
    if swap:
        acts = e * bm * bk
    elif bm >= 256:
        acts = 2 * bm * bk
    else:
        acts = e * bm * bk if bm >= 64 else 0
    weights = 0 if halves and swap else (e if halves else 2) * bn * bk
    small = 4096 + 8 * bm * st
    return max(pipeline + acts + weights + xs + small, min(4 * bm * bn, 64 * 1024))


@functools.lru_cache(maxsize=1 << 20)
def _config_check(gemm: str, items: tuple) -> tuple[str | None, dict[str, Any], int]:
    """The problem-independent half of the constraint, cached: a sweep plans the same space of
    ~10^5 configs at every density, and checking a config is most of the planning time."""
    try:
        cfg = normalize_config(dict(items), gemm)
    except ValueError as e:
        return str(e), {}, 0
    if cfg["DECODE"] == "fp8_scaled" and cfg["UNPACK"] in ("asm16", "halves"):
        return "DECODE fp8_scaled decodes to e4m3 bytes: UNPACK asm16/halves would run as asm", cfg, 0
    return None, cfg, smem_bytes(cfg)


@functools.lru_cache(maxsize=4096)
def _tile_bounds(n: int, density: float) -> tuple[int, int]:
    """Largest useful BLOCK_SIZE_N and BLOCK_SIZE_M for a problem (once per problem, not per config)."""
    return max(16, _next_pow2(n)), max(16, 8 * _next_pow2(density), 64)


def _next_pow2(v: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(v, 1))))


def _t(bm: int, bn: int, bk: int, w: int, st: int, g: int, decode: str, unpack: str, swap: int = 0,
       **switches: int) -> dict:
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, num_warps=w, num_stages=st, GROUP_SIZE_M=g,
                DECODE=decode, UNPACK=unpack, SWAP_AB=swap, **switches)


# sm_90 Triton tiles per rows-per-expert band (rows per expert up to the first number), the fastest measured
# on an H200 for DeepSeek-V4-Flash TP=2 at each band's densities (docs/kernels/fp4_prefill.md, sm_90
# heuristic). The heuristic names them where no Gluon tile of the band runs the shape.
_HOPPER: dict[str, tuple[tuple[float, dict], ...]] = {
    "gate_up": (
        (16, _t(16, 64, 128, 4, 3, 8, "fp8", "lut", 1)),
        (32, _t(32, 256, 64, 4, 3, 16, "fp8", "lut", 1)),
        (64, _t(64, 128, 128, 8, 1, 8, "fp8", "asm16")),
        (128, _t(128, 64, 128, 8, 3, 8, "fp8", "lut", SCALE_AHEAD=1)),
        (math.inf, _t(128, 64, 128, 4, 3, 8, "fp8", "halves")),
    ),
    "down": (
        (16, _t(16, 64, 128, 4, 3, 8, "fp8", "lut", 1)),
        (32, _t(32, 256, 64, 4, 3, 16, "fp8", "lut", 1, W_TMA=1, SCALE_AHEAD=1, A_QUADS=1)),
        (64, _t(64, 64, 128, 4, 3, 8, "fp8", "halves", 1)),
        (128, _t(128, 64, 128, 8, 3, 8, "fp8_row", "lut", SCALE_AHEAD=1)),
        (math.inf, _t(128, 64, 128, 4, 3, 8, "fp8", "halves")),
    ),
}


# The K the Gluon kernels step through (two 128-K chunks a loop trip): a model's K pads up to a multiple
GLUON_K = 256


def padded_k(k: int) -> int:
    """``k`` rounded up to a multiple of 256: the K ``moetune.quant.pad_mxfp4_k`` pads a weight bank to at
    load, so that the Gluon kernels run it, and the K a model's tables are planned and looked up at."""
    return -(-k // GLUON_K) * GLUON_K


def _gluon_constraint(cfg: Mapping[str, Any], shape: Mapping[str, Any], device: DeviceInfo) -> str | None:
    """What IMPL "gluon" needs beyond the config check: sm_90, whole 256-K trips (``padded_k``), and 16 rows
    of the wgmma's M side a warp: of the N tile with SWAP_AB, else of the M tile (here, so that the config
    check stays tile-independent). Any N: the last N tile may be a masked tail."""
    if device.arch != "sm_90":
        return f"IMPL gluon is written for sm_90 (wgmma), not {device.arch}"
    if shape["K"] % GLUON_K:
        return f"IMPL gluon needs K % 256 == 0 (weights zero-padded along K at load), got K {shape['K']}"
    if not cfg["SWAP_AB"] and not cfg["SCALE_RING"] and cfg["num_stages"] < 2:
        return "IMPL gluon with SWAP_AB 0, SCALE_RING 0 needs num_stages >= 2 (one wait covers two chunks)"
    if not cfg["SWAP_AB"] and not cfg["SCALE_RING"] and cfg["BLOCK_SIZE_M"] > 128:
        return "IMPL gluon with SWAP_AB 0, SCALE_RING 0 runs BLOCK_SIZE_M <= 128 (256: misaligned address)"
    if cfg["MMA_HALVES"] and (cfg["num_stages"] < 3 or cfg["BLOCK_SIZE_N"] < 32):
        return "IMPL gluon with MMA_HALVES needs num_stages >= 3 and BLOCK_SIZE_N >= 32 (halves of >= 16)"
    if cfg["A_RESIDENT"]:
        if shape["K"] // 128 < cfg["num_stages"] + 1:
            return f"A_RESIDENT needs K / 128 >= num_stages + 1 (the ring), got K {shape['K']}"
        smem = smem_bytes(cfg, shape["K"])
        if smem > device.max_shared_mem:
            return (f"A_RESIDENT with K {shape['K']} needs ~{smem} bytes of shared memory, device allows "
                    f"{device.max_shared_mem}")
    side = "BLOCK_SIZE_N" if cfg["SWAP_AB"] else "BLOCK_SIZE_M"
    if cfg[side] % (16 * cfg["num_warps"]):
        return f"IMPL gluon gives each warp 16 of {side}'s rows: {side} {cfg[side]}, {cfg['num_warps']} warps"
    return None


def _g(bm: int, bn: int, w: int, st: int, g: int, swap: int, **switches: int | str) -> dict:
    return dict(_t(bm, bn, 128, w, st, g, "fp8_row", "lut", swap), IMPL="gluon", **switches)


# sm_90 Gluon tiles per rows-per-expert band, each band's tried in order: the DeepSeek-V4-Flash TP=2 tables'
# picks on the H200 (docs/kernels/fp4_prefill.md, sm_90 heuristic): the SWAP_AB 1 ring with RING_SPLIT up to
# 33 rows, 64-row SWAP_AB 0 tiles up to 64, the warp-specialized 128-row tile above, its packed weights by
# TMA (W_TMA: faster at each of the 26 dense points swept on both models). Down above 64 rows takes
# the resident tile with bf16 rows where its activations fit, else the same without residency. Any N runs
# them (a tail tile where BLOCK_SIZE_N does not divide N: gpt-oss-120b's N 2880 at BN 128, 22.5 tiles, does
# 2% more work than a whole-tile N). Left to the sweep: variants faster on one K only (MAXNREG 96, faster at
# down's K 1024 and slower at gate/up's 4096; the 16-row resident tile).
_HOPPER_GLUON: dict[str, tuple[tuple[float, tuple[dict, ...]], ...]] = {
    "gate_up": (
        (13, (_g(16, 64, 4, 3, 8, 1, SCALE_RING=1, RING_SPLIT=1),)),
        (33, (_g(32, 64, 4, 3, 8, 1, SCALE_RING=1, RING_SPLIT=1),)),
        (64, (_g(64, 128, 4, 3, 8, 0, MMA_HALVES=1),)),
        (math.inf, (_g(128, 128, 8, 2, 1, 0, DECODE_WARPS=4, W_TMA=1),)),
    ),
    "down": (
        (13, (_g(16, 64, 4, 3, 8, 1, SCALE_RING=1, RING_SPLIT=1),)),
        (33, (_g(32, 64, 4, 3, 8, 1, SCALE_RING=1, RING_SPLIT=1),)),
        (64, (_g(64, 128, 4, 3, 8, 0, SCALE_RING=1),)),
        (math.inf, (_g(128, 128, 8, 2, 1, 0, DECODE_WARPS=4, A_RESIDENT=1, OUT_DTYPE="bf16", W_TMA=1),
                    _g(128, 128, 8, 2, 1, 0, DECODE_WARPS=4, OUT_DTYPE="bf16", W_TMA=1))),
    ),
}
# what every sm_90 part lets one program opt in to (H100 and H200 alike): the heuristic sees the arch only
_SM90_SMEM = 227 * 1024


def _hopper_gluon_pick(gemm: str, density: float, shape: Mapping[str, Any]) -> dict[str, Any] | None:
    """The band's first Gluon tile the shape lets run (K a multiple of 256, resident activations within
    shared memory) with whole N tiles, or None. A tail N tile is searched by sweeps, each candidate checked
    on the GPU first, but not named here until its speed is measured (docs/kernels/fp4_prefill.md)."""
    sm90 = DeviceInfo("sm_90 (heuristic)", "sm_90", 0, _SM90_SMEM, 0, True)
    cfgs = next((cfgs for top, cfgs in _HOPPER_GLUON[gemm] if density <= top), ())
    return next((dict(c) for c in cfgs if shape["N"] % c["BLOCK_SIZE_N"] == 0
                 and _gluon_constraint(normalize_config(c, gemm), shape, sm90) is None), None)


def _hopper_pick(gemm: str, density: float) -> dict[str, Any]:
    return dict(next(cfg for top, cfg in _HOPPER[gemm] if density <= top))


def _fit(cfg: dict[str, Any], shape: Mapping[str, Any]) -> dict[str, Any]:
    """Shrink measured tiles to a smaller shape: N to what N needs, K to a power of two <= K.

    ``halves`` and ``lut`` need BLOCK_SIZE_K >= 64; below that the pick falls back to ``join``, no SWAP_AB.
    """
    cfg["BLOCK_SIZE_N"] = min(cfg["BLOCK_SIZE_N"], max(16, _next_pow2(shape["N"])))
    cfg["BLOCK_SIZE_K"] = min(cfg["BLOCK_SIZE_K"], 1 << int(math.log2(shape["K"])))
    if cfg["UNPACK"] in ("halves", "lut") and cfg["BLOCK_SIZE_K"] < 64:
        cfg.update(UNPACK="join", SWAP_AB=0)
    if cfg["UNPACK"] != "lut" or cfg["BLOCK_SIZE_M"] > cfg["BLOCK_SIZE_N"]:
        cfg["A_QUADS"] = 0
    return cfg


def gemm_shapes(experts: int, hidden: int, inter: int, top_k: int, *, gate_up_k: int | None = None,
                down_k: int | None = None) -> dict[str, dict[str, int]]:
    """Each GEMM's table shape for one rank: gate/up [2*inter, hidden], down [hidden, inter]. ``gate_up_k``
    and ``down_k``: the K its weights were zero-padded to, if they were (``moetune.quant.pad_mxfp4_k``; a
    model's tables are planned at ``padded_k``)."""
    return {"gate_up": {"E": experts, "N": 2 * inter, "K": hidden if gate_up_k is None else gate_up_k,
                        "top_k": top_k},
            "down": {"E": experts, "N": hidden, "K": inter if down_k is None else down_k, "top_k": top_k}}


class Fp4PrefillRules(TileRules):
    """Rules of one of the two GEMMs (``gemm``: "gate_up" or "down")."""

    gemm = "gate_up"
    space = SPACE
    default = DEFAULT

    def check_config(self, config: Mapping[str, Any]) -> None:
        normalize_config(config, self.gemm)

    def normalize_shape(self, shape: Mapping[str, Any]) -> dict[str, Any]:
        out = super().normalize_shape(shape)
        if out["K"] % 32:
            raise ValueError(f"{self.name}: shape K must be a multiple of 32, got {out['K']}")
        return out

    def constraint(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        try:
            reason, cfg, smem = _config_check(self.gemm, tuple(config.items()))
        except TypeError:  # an unhashable value: not cacheable, and not a valid config either
            reason, cfg, smem = _config_check.__wrapped__(self.gemm, tuple(config.items()))
        if reason:
            return reason
        shape = problem.shape
        max_n, max_m = _tile_bounds(shape["N"], problem.density)
        if cfg["BLOCK_SIZE_K"] > shape["K"]:
            return f"BLOCK_SIZE_K {cfg['BLOCK_SIZE_K']} exceeds K {shape['K']}"
        if cfg["BLOCK_SIZE_N"] > max_n:
            return f"BLOCK_SIZE_N {cfg['BLOCK_SIZE_N']} is larger than N {shape['N']} needs"
        if cfg["BLOCK_SIZE_M"] > max_m:
            return f"BLOCK_SIZE_M {cfg['BLOCK_SIZE_M']} is far above {problem.density:.3g} rows per expert"
        if smem > device.max_shared_mem:
            return f"needs ~{smem} bytes of shared memory, device allows {device.max_shared_mem}"
        if cfg["IMPL"] == "gluon":
            return _gluon_constraint(cfg, shape, device)
        return None

    def heuristic(self, shape: Mapping[str, Any], routes: int, arch: str) -> Config:
        m = re.fullmatch(r"sm_(\d+)", arch)
        density = routes / shape["E"]
        if m is None:
            return dict(self.default)
        if int(m.group(1)) >= 90:
            gluon = _hopper_gluon_pick(self.gemm, density, shape)
            if gluon is not None:
                return {**self.default, **gluon}
            return _fit(dict(self.default, **_hopper_pick(self.gemm, density)), shape)
        # Below sm_90 (a rule measured on sm_89): the M tile tracks rows per expert, wide K tiles.
        bm = 16 if density <= 16 else 32 if density <= 48 else 128
        return dict(self.default, BLOCK_SIZE_M=bm,
                    BLOCK_SIZE_N=64 if bm == 16 and self.gemm == "gate_up" else 128,
                    BLOCK_SIZE_K=128, num_warps=8 if bm >= 128 else 4)


class GateUpRules(Fp4PrefillRules):
    name = "fp4_prefill.gate_up"
    gemm = "gate_up"
    space = {k: v for k, v in SPACE.items() if k != "OUT_DTYPE"}


class DownRules(Fp4PrefillRules):
    name = "fp4_prefill.down"
    gemm = "down"
    space = {k: v for k, v in SPACE.items() if k != "A_LAYOUT"}
    default = {k: v for k, v in DEFAULT.items() if k != "A_LAYOUT"}


RULES = (GateUpRules(), DownRules())
