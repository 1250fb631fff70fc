"""FP4 (ds_fp4 / MXFP4 weights, W4A8 numerics) grouped MoE prefill: gate/up GEMM, swiglu, down GEMM.

Pipeline: x is quantized per token per 128 to e4m3; routes are sorted by expert and
padded to whole M-blocks; the gate/up GEMM (A row = token) writes one fp32 row per
route; one fused kernel applies swiglu (optional clamp) times the routing weight in
fp32 and quantizes the result the same way; the down GEMM (A row = route) writes fp32
rows that are summed over top_k.
Inactive routes (``topk_ids == -1``) are dropped by the alignment, so nothing of
theirs is read and they contribute zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.kernels.activations import gated_activation
from moetune.kernels.fp4_prefill import triton_gemm as fp4_gemm
from moetune.kernels.fp4_prefill.act_quant import act_quant, swiglu_quant
from moetune.kernels.fp4_prefill.align import Alignment, align_routes
from moetune.kernels.fp4_prefill.config import GEMMS, normalize_config
from moetune.kernels.fp4_prefill.moe_sum import moe_sum
from moetune.quant.fp8_act import dequantize_fp8_act, quantize_fp8_act
from moetune.quant.mxfp4 import dequantize_mxfp4

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
OUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # a GEMM's per-route rows (config OUT_DTYPE)
# Scale codes each decode handles exactly (see fp4_gemm).
SCALE_RANGE = {"bf16": (0, 240), "fp8": (2, 254), "fp8_row": (2, 254), "f16": (2, 254),
               "fp8_scaled": (0, 248)}


def grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 out: torch.Tensor, align: Alignment, *, a_div: int, config: Mapping[str, Any],
                 a_k_order: str = "real") -> None:
    """``out[r] = dequant(a[r // a_div]) @ dequant(w[expert(r)]).T`` for every aligned route ``r``.

    With ``A_LAYOUT = "gathered"`` the A rows (and their scales) are first copied into
    slot order by the one-launch gather, and the GEMM reads contiguous rows. ``a_k_order="wgmma"``:
    ``a`` is in the K order of IMPL "gluon" (``quantize_fp8_act(k_order="wgmma")``), which only it reads.
    """
    gluon = config.get("IMPL", "triton") == "gluon"
    if a_k_order == "wgmma" and not gluon:
        raise ValueError("a_k_order 'wgmma' is the K order of config IMPL 'gluon'; this config runs IMPL "
                         f"{config.get('IMPL', 'triton')!r}, which reads A in real order")
    out_dtype = OUT_DTYPES[config.get("OUT_DTYPE", "fp32")]
    if out.dtype != out_dtype:
        raise ValueError(f"out is {out.dtype}, config OUT_DTYPE {config.get('OUT_DTYPE', 'fp32')!r} writes "
                         f"{out_dtype}")
    gathered = config.get("A_LAYOUT", "indexed") == "gathered"
    if gathered:
        from moetune.kernels.gather_rows.gather import gather_rows_with_scales

        ids = align.sorted_ids
        src = torch.where(ids < align.routes, ids // a_div, torch.zeros_like(ids))
        a, a_scale = gather_rows_with_scales(a, a_scale, src)
    if gluon:
        from moetune.kernels.fp4_prefill import (
            gluon_gemm as fp4_wgmma,  # Gluon: imported when used, it has no interpreter
        )

        fp4_wgmma.launch(a, a_scale, w, w_scale, out, align, a_div=a_div, gathered=gathered, config=config,
                         a_k_order=a_k_order)
    else:
        fp4_gemm.launch(a, a_scale, w, w_scale, out, align, a_div=a_div, gathered=gathered, config=config)


def _tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    return t


def _check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                  topk_ids) -> tuple[int, int, int, int]:
    """ValueError naming the argument; returns (experts, intermediate, and the two GEMMs' K: the hidden and
    intermediate sizes, or what the weights were zero-padded to along K)."""
    _tensor("x", x, _FLOATS, 2)
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale),
                    ("w2_packed", w2_packed), ("w2_scale", w2_scale)):
        _tensor(name, t, (torch.uint8,), 3)
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    _tensor("topk_weights", topk_weights, _FLOATS, 2)
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), 2)
    m, h = x.shape
    if h % 32:
        raise ValueError(f"x: hidden size {h} must be a multiple of 32 (the MXFP4 scale block)")
    e, two_i, half_k1 = w13_packed.shape
    k1 = 2 * half_k1
    if not h <= k1 < h + 256 or k1 % 32:
        raise ValueError(f"w13_packed must be [E, 2I, H/2] with H/2 = {h // 2} (or zero-padded along K by "
                         f"under 256 to a multiple of 32), got {tuple(w13_packed.shape)}")
    if two_i % 2 or (two_i // 2) % 32:
        raise ValueError(f"w13_packed: 2I = {two_i} must be twice a multiple of 32")
    inter = two_i // 2
    if tuple(w13_scale.shape) != (e, two_i, k1 // 32):
        raise ValueError(f"w13_scale must be [{e}, {two_i}, {k1 // 32}] to match w13_packed, "
                         f"got {tuple(w13_scale.shape)}")
    k2 = 2 * w2_packed.shape[2]
    if w2_packed.shape[:2] != (e, h) or not inter <= k2 < inter + 256 or k2 % 32:
        raise ValueError(f"w2_packed must be [{e}, {h}, {inter // 2}] (or zero-padded along K by under 256 "
                         f"to a multiple of 32), got {tuple(w2_packed.shape)}")
    if tuple(w2_scale.shape) != (e, h, k2 // 32):
        raise ValueError(f"w2_scale must be [{e}, {h}, {k2 // 32}] to match w2_packed, "
                         f"got {tuple(w2_scale.shape)}")
    if topk_ids.shape[0] != m or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [{m}, top_k], got {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights must match topk_ids {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    for name, t in (("w13_packed", w13_packed), ("w13_scale", w13_scale), ("w2_packed", w2_packed),
                    ("w2_scale", w2_scale), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: all inputs must share a device")
    return e, inter, k1, k2


def _configs(config: Mapping[str, Any] | None, shapes: dict[str, dict[str, int]],
             routes: int) -> dict[str, dict[str, Any]]:
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping {{'gate_up': {{...}}, 'down': {{...}}}}, "
                         f"got {type(config).__name__}")
    config = config or {}
    unknown = set(config) - set(GEMMS)
    if unknown:
        raise ValueError(f"config: unknown key(s) {sorted(unknown)}; expected per-GEMM configs "
                         f"under {list(GEMMS)}")
    out = {}
    for gemm in GEMMS:
        cfg = config.get(gemm)
        if cfg is None:
            from moetune.tables.picker import pick_config

            cfg = pick_config(f"fp4_prefill.{gemm}", shapes[gemm], routes)
        out[gemm] = normalize_config(dict(cfg), gemm)
    return out


def _validate_values(cfgs, w13_scale, w2_scale, topk_ids, experts: int) -> None:
    """Host-syncing checks, only with ``validate=True``."""
    if ((topk_ids < -1) | (topk_ids >= experts)).any():
        raise ValueError(f"topk_ids has ids outside [-1, {experts})")
    for name, s, gemm in (("w13_scale", w13_scale, "gate_up"), ("w2_scale", w2_scale, "down")):
        lo, hi = SCALE_RANGE[cfgs[gemm]["DECODE"]]
        if s.numel() and (s.min() < lo or s.max() > hi):
            raise ValueError(f"{name} has scale codes outside [{lo}, {hi}], which DECODE "
                             f"{cfgs[gemm]['DECODE']!r} cannot represent")


def fp4_prefill_moe(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                    w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, *, swiglu_limit: float | None = None,
                    config: Mapping[str, Any] | None = None, validate: bool = False) -> torch.Tensor:
    """Routed-expert MoE output ``[M, H]`` (dtype of ``x``) from MXFP4 expert banks.

    Args:
        x: ``[M, H]`` bf16/fp16/fp32 activations.
        w13_packed, w13_scale: ``[E, 2I, H/2]`` codes and ``[E, 2I, H/32]`` UE8M0 scales
            (gate rows, then up rows).
        w2_packed, w2_scale: ``[E, H, I/2]`` and ``[E, H, I/32]``. Either pair may be zero-padded along K
            by under 256 (:func:`moetune.quant.pad_mxfp4_k`, once at load): the activations are quantized to
            the padded width, so a K that is not a multiple of 256 can run the Gluon kernels.
        topk_weights, topk_ids: ``[M, top_k]``; id -1 marks an inactive route.
        swiglu_limit: optional clamp (gate above, up both sides) before silu(gate) * up.
        config: ``{"gate_up": {...}, "down": {...}}``, each with BLOCK_SIZE_M/N/K,
            GROUP_SIZE_M, num_warps, num_stages and the design switches DECODE, UNPACK
            (and A_LAYOUT for gate/up); a missing GEMM asks the tile picker.
        validate: also check id ranges and scale codes (syncs with the host).
    """
    experts, inter, k1, k2 = _check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                           topk_ids)
    m, h = x.shape
    top_k = topk_ids.shape[1]
    routes = m * top_k
    shapes = {"gate_up": {"E": experts, "N": 2 * inter, "K": k1, "top_k": top_k},
              "down": {"E": experts, "N": h, "K": k2, "top_k": top_k}}
    cfgs = _configs(config, shapes, routes)
    if validate:
        _validate_values(cfgs, w13_scale, w2_scale, topk_ids, experts)
    if m == 0:
        return x.new_empty((0, h))

    # IMPL gluon reads its activations in the wgmma K order: their producers write it (no copy).
    order = {g: "wgmma" if cfgs[g]["IMPL"] == "gluon" else "real" for g in GEMMS}
    if "wgmma" in order.values():
        from moetune.kernels.fp4_prefill import gluon_gemm as fp4_wgmma

        for gemm, a_k, w in (("gate_up", k1, w13_packed), ("down", k2, w2_packed)):
            if order[gemm] == "wgmma":
                fp4_wgmma.check_problem(a_k, w, cfgs[gemm])
    xq, xs = act_quant(x, k_order=order["gate_up"], width=k1)
    align_gu = align_routes(topk_ids, experts, cfgs["gate_up"]["BLOCK_SIZE_M"])
    gate_up = torch.empty(routes, 2 * inter, dtype=torch.float32, device=x.device)
    grouped_gemm(xq, xs, w13_packed, w13_scale, gate_up, align_gu, a_div=top_k, config=cfgs["gate_up"],
                 a_k_order=order["gate_up"])
    # Rows of inactive routes are never written here, nor read by the down GEMM.
    hq, hs = swiglu_quant(gate_up, topk_weights.reshape(-1).float(), topk_ids.reshape(-1), swiglu_limit,
                          k_order=order["down"], width=k2)
    bm_down = cfgs["down"]["BLOCK_SIZE_M"]
    align_dn = align_gu if bm_down == align_gu.block_m else align_routes(topk_ids, experts, bm_down)
    # inactive routes' rows: never read
    down = torch.empty(routes, h, dtype=OUT_DTYPES[cfgs["down"]["OUT_DTYPE"]], device=x.device)
    grouped_gemm(hq, hs, w2_packed, w2_scale, down, align_dn, a_div=1, config=cfgs["down"],
                 a_k_order=order["down"])
    return moe_sum(down, topk_ids, x.dtype)


def fp4_prefill_moe_reference(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                              w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                              topk_ids: torch.Tensor, *, swiglu_limit: float | None = None,
                              config: Mapping[str, Any] | None = None,
                              validate: bool = False) -> torch.Tensor:
    """Pure torch, fp32: dequantized weights (any K padding dropped), the same activation quantization;
    ``config`` is ignored."""
    experts, inter, _, _ = _check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                         topk_ids)
    m, h = x.shape
    out = torch.zeros(m, h, dtype=torch.float32, device=x.device)
    if m == 0:
        return out.to(x.dtype)
    xd = dequantize_fp8_act(*quantize_fp8_act(x))
    ids = topk_ids.long()
    if validate and ((ids < -1) | (ids >= experts)).any():
        raise ValueError(f"topk_ids has ids outside [-1, {experts})")
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gu = xd[tok] @ dequantize_mxfp4(w13_packed[e], w13_scale[e])[:, :h].T
        act = gated_activation(gu[:, :inter], gu[:, inter:], "silu", swiglu_limit)
        act = act * topk_weights[tok, slot].float().unsqueeze(1)
        hd = dequantize_fp8_act(*quantize_fp8_act(act))
        out.index_add_(0, tok, hd @ dequantize_mxfp4(w2_packed[e], w2_scale[e])[:, :inter].T)
    return out.to(x.dtype)
