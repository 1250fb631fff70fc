"""FP8 block-scale (W8A16) MoE decode layer: gate/up GEMM -> gated activation -> down GEMM -> top_k sum.

Weights are float8_e4m3fn with one scale per 128x128 block (``moetune.quant.fp8_block``). The modules of
this package, in the order a layer runs them:

- ``align``: routes bucketed by expert for the grouped GEMM (once per layer, shared by both GEMMs);
- ``split``: A_FP8 2's two-term fp8 split of the gate/up input;
- ``gemm``: the block-FP8 GEMM (``fp8_block_gemm``: algorithms "route" and "grouped", split-K, A_FP8);
- ``epilogue``: the gated activation (which also writes the down GEMM's A_FP8 2 split), the top_k sum,
  and their FUSE forms fused into the GEMVs;
- ``config``: the tile space, checks, constraints and the picker's fallback heuristic;
- ``reference``: the pure-torch fp32 reference.

Inactive routes (``topk_ids == -1``, computed elsewhere, e.g. on the CPU) cost nothing and contribute
zero. Launch shapes depend only on M, top_k, the weight shapes and the configs, so the whole layer
replays from one CUDA graph while the routing changes. Intermediates (the gate/up output, per-route down
output) are fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton

from moetune.kernels.activations import check_activation
from moetune.kernels.fp8_decode.align import align_routes
from moetune.kernels.fp8_decode.config import GEMMS, SCALE_BLOCK, check_gemm_config, gemm_shapes
from moetune.kernels.fp8_decode.epilogue import (
    fused_down_sum,
    fused_gate_up_act,
    gated_activation_rows,
    sum_topk,
)
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.pdl import resolve_pdl
from moetune.kernels.rules import picked_routes
from moetune.quant.fp8_block import FP8_DTYPE

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation, swiglu_limit):
    """Shapes (M, H, E, I, top_k); ValueError naming the argument and the expected value otherwise."""
    named = dict(x=x, w13=w13, w13_scale=w13_scale, w2=w2, w2_scale=w2_scale,
                 topk_weights=topk_weights, topk_ids=topk_ids)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    ranks = dict(x=2, w13=3, w13_scale=3, w2=3, w2_scale=3, topk_weights=2, topk_ids=2)
    for name, rank in ranks.items():
        if named[name].dim() != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {tuple(named[name].shape)}")
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    for name in ("w13", "w2"):
        if named[name].dtype != FP8_DTYPE:
            raise ValueError(f"{name} must be {FP8_DTYPE}, got {named[name].dtype}")
    for name in ("w13_scale", "w2_scale"):
        if named[name].dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name} must be float32 or bfloat16, got {named[name].dtype}")
    if topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be float32, got {topk_weights.dtype}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    for name, t in named.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, expected x's device {x.device}")
    m, h = x.shape
    e, n13, h13 = w13.shape
    if n13 % 2 or n13 == 0:
        raise ValueError(f"w13 must be [E, 2*I, H] with gate rows then up rows; dim 1 is {n13}, not even")
    inter = n13 // 2
    if h13 != h:
        raise ValueError(f"w13 must be [E, 2*I, {h}] (H from x), got {tuple(w13.shape)}")
    if tuple(w2.shape) != (e, h, inter):
        raise ValueError(f"w2 must be [{e}, {h}, {inter}] (E, H, I from w13 and x), got {tuple(w2.shape)}")
    for name, (rows, cols) in (("w13_scale", (n13, h)), ("w2_scale", (h, inter))):
        s = named[name]
        nb, kb = triton.cdiv(rows, SCALE_BLOCK), triton.cdiv(cols, SCALE_BLOCK)
        if s.shape[0] != e or s.shape[1] != nb or s.shape[2] < kb:
            raise ValueError(f"{name} must be [{e}, {nb}, >= {kb}] (one scale per 128x128 block), "
                             f"got {tuple(s.shape)}")
    if topk_ids.shape[0] != m or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [{m}, top_k] (M from x), got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    check_activation(activation, swiglu_limit)
    return m, h, e, inter, topk_ids.shape[1]


# fused=True's tiles for GEMMs the caller leaves out: 2 launches in all (docs/kernels/fp8_decode.md, FUSE)
FUSED_CONFIG: dict[str, dict[str, Any]] = {
    "gate_up": {"ALGO": "route", "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 512, "FUSE": 1, "num_stages": 3},
    "down": {"ALGO": "route", "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "FUSE": 1, "num_stages": 2},
}


# a hint of no active route: one token's tiles (route kernels: no alignment, no split launch) loop over the
# active routes, so an idle GEMM costs its launch (docs/kernels/fp8_decode.md, PERSISTENT)
IDLE_PERSISTENT = 2
# the idle tiles where the one-token pick is a grouped one (short K, few experts): the plain GEMV
IDLE_ROUTE_CONFIG: dict[str, Any] = {"ALGO": "route", "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256}


def resolve_config(config: Mapping[str, Any] | None, shapes: Mapping[str, dict], routes: int,
                   fused: bool = False, idle: bool = False) -> dict[str, dict[str, Any]]:
    """Per-GEMM configs: checked ``config`` entries; for missing ones the tile picker's choice for
    ``routes``, or ``FUSED_CONFIG`` with ``fused`` (which then requires FUSE 1 in every given entry).
    With ``idle`` (the deployment expects no active route) the picker is asked for one token's routes
    and its route-kernel tiles run on ``IDLE_PERSISTENT`` programs per SM (``IDLE_ROUTE_CONFIG`` where
    that pick is grouped): no alignment launch, and an inactive route costs no program."""
    if not isinstance(fused, bool):
        raise ValueError(f"fused must be True or False, got {fused!r}")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be None or a mapping {{'gate_up': {{...}}, 'down': {{...}}}}, "
                         f"got {type(config).__name__}")
    unknown = set(config) - set(GEMMS)
    if unknown:
        raise ValueError(f"config: unknown key(s) {sorted(unknown)}; expected {list(GEMMS)}")
    out = {}
    for gemm in GEMMS:
        if gemm in config:
            out[gemm] = check_gemm_config(config[gemm], f"config[{gemm!r}]")
            if fused and not out[gemm]["FUSE"]:
                raise ValueError(f"config[{gemm!r}]['FUSE'] must be 1 with fused=True, got 0")
        elif fused:
            out[gemm] = check_gemm_config(FUSED_CONFIG[gemm])
        else:
            from moetune.tables.picker import pick_config

            shape = shapes[gemm]
            picked = pick_config(f"fp8_decode.{gemm}", shape, shape["top_k"] if idle else routes)
            if idle:
                route = picked if picked.get("ALGO", "route") == "route" else IDLE_ROUTE_CONFIG
                picked = {**route, "PERSISTENT": IDLE_PERSISTENT}
            out[gemm] = check_gemm_config(picked, f"picked config for fp8_decode.{gemm}")
    return out


def fp8_decode_moe(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                   w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   activation: str = "silu", swiglu_limit: float | None = None,
                   config: Mapping[str, Any] | None = None, fused: bool = False, validate: bool = False,
                   pdl: bool | None = None, active_share: float | None = None) -> torch.Tensor:
    """MoE layer output ``[M, H]`` in x's dtype for block-FP8 experts; routes with id -1 contribute 0.

    Shapes: x [M, H]; w13 [E, 2I, H] fp8 (gate rows, then up rows); w13_scale [E, ceil(2I/128),
    >= ceil(H/128)]; w2 [E, H, I] fp8; w2_scale [E, ceil(H/128), >= ceil(I/128)]; topk_weights [M, top_k]
    fp32; topk_ids [M, top_k] int32/int64 in [-1, E). ``config``: ``{"gate_up": {...}, "down": {...}}``
    tile parameters (``GEMM_DEFAULT`` keys); missing GEMMs use ``moetune.tables.picker.pick_config``.
    ``validate=True`` checks the ids (one host sync); otherwise the path never syncs.

    ``fused=True`` runs the layer as 2 launches (activation inside gate/up, top_k sum inside down;
    ``FUSED_CONFIG`` unless ``config`` gives FUSE configs) instead of 4-5. Its GEMVs have no split-K, so
    it pays only where (nearly) every route is inactive and the layer is its fixed cost
    (docs/kernels/fp8_decode.md, FUSE).

    ``pdl=True`` launches every kernel with programmatic dependent launch (sm_90+; ignored by the
    interpreter): each waits for the previous kernel's writes at its start and lets the next one launch
    right after, so at decode the launches overlap instead of following each other. ``None`` (default):
    on for sm_90 and newer (docs/kernels/fp8_decode.md, PDL).

    ``active_share``: the share of top-k slots the deployment expects active (hybrid offload knows it),
    a static hint: the picker chooses tiles for that many active routes (``picked_routes``) instead of
    all of them; with 0, one token's route-kernel tiles on the persistent grid (``IDLE_PERSISTENT``),
    which costs its launches alone when nothing is active. The result is exact whatever the routing;
    only speed depends on the hint.
    """
    m, h, e, inter, top_k = check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                         activation, swiglu_limit)
    pdl = resolve_pdl(pdl, x)
    dtype = _dtype_name(x.dtype)
    shapes = gemm_shapes(e, h, inter, top_k, dtype)
    cfg = resolve_config(config, shapes, picked_routes(m, top_k, active_share), fused,
                         idle=active_share == 0)
    if validate and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < -1 or hi >= e:
            raise ValueError(f"topk_ids must lie in [-1, {e}), got values in [{lo}, {hi}]")
    if m == 0:
        return x.new_empty((0, h))
    buffers = layer_buffers(m, top_k, h, inter, x.dtype, cfg, x.device)
    return decode_moe_into(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, cfg, buffers,
                           activation, swiglu_limit, pdl)


def layer_buffers(m: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype,
                  config: Mapping[str, dict], device) -> dict[str, torch.Tensor]:
    """Uninitialised buffers for ``decode_moe_into``: fp32 K-split partials of both GEMMs, the activation
    in x's dtype (and its A_FP8 2 split, hi / lo / sa, where the down GEMM reads one the activation
    writes), the output. Sizes depend only on M, top_k, the shapes and the config."""
    routes = m * top_k
    splits = {g: 0 if config[g].get("FUSE") else config[g]["SPLIT_K"] for g in GEMMS}  # FUSE: unused
    bufs = {"gate_up": torch.empty(splits["gate_up"], routes, 2 * inter, device=device),
            "act": torch.empty(routes, inter, dtype=dtype, device=device),
            "down": torch.empty(splits["down"], routes, hidden, device=device),
            "out": torch.empty(m, hidden, dtype=dtype, device=device)}
    if _act_split(config):
        bufs["act_hi"] = torch.empty(routes, inter, dtype=FP8_DTYPE, device=device)
        bufs["act_lo"] = torch.empty(routes, inter, dtype=FP8_DTYPE, device=device)
        bufs["act_sa"] = torch.empty(routes, triton.cdiv(inter, SCALE_BLOCK), device=device)
    return bufs


def _act_split(config: Mapping[str, dict]) -> bool:
    """Does the gated activation write the down GEMM's A_FP8 2 split (one launch less)?"""
    gate_up, down = config["gate_up"], config["down"]
    return not gate_up.get("FUSE") and not down.get("FUSE") and down.get("A_FP8") == 2


def decode_moe_into(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, config: Mapping[str, dict],
                    buffers: Mapping[str, torch.Tensor], activation: str = "silu",
                    swiglu_limit: float | None = None, pdl: bool = False) -> torch.Tensor:
    """The launches of ``fp8_decode_moe`` on checked inputs and resolved configs, writing the caller's
    ``buffers`` (``layer_buffers``), so a CUDA-graph test can poison every intermediate before a replay.
    Returns ``buffers["out"]``. ``pdl``: every Triton launch uses programmatic dependent launch."""
    e, top_k = w13.shape[0], topk_ids.shape[1]
    ids = topk_ids.reshape(-1).contiguous()
    rw = topk_weights.reshape(-1).contiguous()
    aligned: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for c in config.values():
        if c["ALGO"] == "grouped" and c["BLOCK_SIZE_M"] not in aligned:
            aligned[c["BLOCK_SIZE_M"]] = align_routes(ids, e, c["BLOCK_SIZE_M"], pdl=pdl)
    gu, act = buffers["gate_up"], buffers["act"]
    split = (buffers["act_hi"], buffers["act_lo"], buffers["act_sa"]) if _act_split(config) else None
    if config["gate_up"].get("FUSE"):
        fused_gate_up_act(x, w13, w13_scale, ids, act, config["gate_up"], activation, swiglu_limit, pdl=pdl)
    else:
        fp8_block_gemm(x, w13, w13_scale, ids, gu, config["gate_up"], a_row_div=top_k,
                       aligned=aligned.get(config["gate_up"]["BLOCK_SIZE_M"]), pdl=pdl, fill_inactive=False)
        gated_activation_rows(gu, ids, act, activation, swiglu_limit, pdl=pdl, split=split,
                              fill_inactive=False)
    if config["down"].get("FUSE"):
        return fused_down_sum(act, w2, w2_scale, ids, rw, buffers["out"], config["down"], pdl=pdl)
    fp8_block_gemm(act, w2, w2_scale, ids, buffers["down"], config["down"], topk_weights=rw,
                   aligned=aligned.get(config["down"]["BLOCK_SIZE_M"]),
                   a_split=split, pdl=pdl, fill_inactive=False)
    return sum_topk(buffers["down"], ids, buffers["out"], pdl=pdl)
