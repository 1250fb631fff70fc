"""FP4 (ds_fp4 / MXFP4 weights, W4A8 numerics) grouped MoE prefill: gate/up GEMM, gated activation, down
GEMM.

Pipeline: x is quantized per token per 128 to e4m3; routes are sorted by expert and
padded to whole M-blocks; the gate/up GEMM (A row = token) writes one fp32 row per
route; one fused kernel applies the gated activation (silu, gelu_tanh or gpt-oss's
swiglu, optional clamp) times the routing weight in fp32 and quantizes the result the
same way; the down GEMM (A row = route) writes fp32 (config OUT_DTYPE "bf16": bf16)
rows that are summed over top_k. Optional expert biases live outside the GEMMs: the gate/up bias is added
in the activation kernel, the down bias (times the routing weight) in the sum.
Inactive routes (``topk_ids == -1``) are dropped by the alignment, so nothing of
theirs is read and they contribute zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.kernels.activations import check_activation
from moetune.kernels.fp4_prefill import triton_gemm
from moetune.kernels.fp4_prefill.act_quant import act_quant, swiglu_quant
from moetune.kernels.fp4_prefill.align import Alignment, align_routes
from moetune.kernels.fp4_prefill.config import GEMMS, gemm_shapes, normalize_config
from moetune.kernels.fp4_prefill.inputs import check_biases, check_inputs, check_scale_max
from moetune.kernels.fp4_prefill.moe_sum import moe_sum
from moetune.kernels.rules import picked_routes
from moetune.quant.mxfp4 import scale_row_max

OUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # a GEMM's per-route rows (config OUT_DTYPE)
# Scale codes each decode handles exactly (see triton_gemm).
SCALE_RANGE = {"bf16": (0, 240), "fp8": (2, 254), "fp8_row": (2, 254), "f16": (2, 254),
               "fp8_scaled": (0, 248)}


def grouped_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 out: torch.Tensor, align: Alignment, *, a_div: int, config: Mapping[str, Any],
                 a_k_order: str = "real", w_scale_max: torch.Tensor | None = None) -> None:
    """``out[r] = dequant(a[r // a_div]) @ dequant(w[expert(r)]).T`` for every aligned route ``r``.

    With ``A_LAYOUT = "gathered"`` the A rows (and their scales) are first copied into
    slot order by the one-launch gather, and the GEMM reads contiguous rows. ``a_k_order="wgmma"``:
    ``a`` is in the K order of IMPL "gluon" (``quantize_fp8_act(k_order="wgmma")``), which only it reads.
    ``w_scale_max``: the weights' row maxima (``moetune.quant.scale_row_max``), which IMPL "gluon" reads
    instead of a pass over each tile's scales; the Triton kernels make their own.
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
        from moetune.kernels.fp4_prefill import gluon_gemm  # imported when used: Gluon has no interpreter

        gluon_gemm.launch(a, a_scale, w, w_scale, out, align, a_div=a_div, gathered=gathered, config=config,
                          a_k_order=a_k_order, w_smax=w_scale_max)
    else:
        triton_gemm.launch(a, a_scale, w, w_scale, out, align, a_div=a_div, gathered=gathered, config=config)


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


def _validate_values(cfgs, w13_scale, w2_scale, topk_ids, experts: int, w13_scale_max, w2_scale_max) -> None:
    """Host-syncing checks, only with ``validate=True``."""
    if ((topk_ids < -1) | (topk_ids >= experts)).any():
        raise ValueError(f"topk_ids has ids outside [-1, {experts})")
    for name, smax, s in (("w13_scale_max", w13_scale_max, w13_scale),
                          ("w2_scale_max", w2_scale_max, w2_scale)):
        if smax is not None and not torch.equal(smax, scale_row_max(s)):
            raise ValueError(f"{name} is not the scale's row maxima (moetune.quant.scale_row_max of the "
                             f"scale as given, after any padding)")
    for name, s, gemm in (("w13_scale", w13_scale, "gate_up"), ("w2_scale", w2_scale, "down")):
        lo, hi = SCALE_RANGE[cfgs[gemm]["DECODE"]]
        if s.numel() and (s.min() < lo or s.max() > hi):
            raise ValueError(f"{name} has scale codes outside [{lo}, {hi}], which DECODE "
                             f"{cfgs[gemm]['DECODE']!r} cannot represent")


def fp4_prefill_moe(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                    w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, *, activation: str = "silu", swiglu_limit: float | None = None,
                    config: Mapping[str, Any] | None = None, validate: bool = False,
                    w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
                    active_share: float | None = None, w13_scale_max: torch.Tensor | None = None,
                    w2_scale_max: torch.Tensor | None = None) -> torch.Tensor:
    """Routed-expert MoE output ``[M, H]`` (dtype of ``x``) from MXFP4 expert banks.

    Args:
        x: ``[M, H]`` bf16/fp16/fp32 activations.
        w13_packed, w13_scale: ``[E, 2I, H/2]`` codes and ``[E, 2I, H/32]`` UE8M0 scales
            (gate rows, then up rows).
        w2_packed, w2_scale: ``[E, H, I/2]`` and ``[E, H, I/32]``. Either pair may be zero-padded along K
            by under 256 (:func:`moetune.quant.pad_mxfp4_k`, once at load): the activations are quantized to
            the padded width, so a K that is not a multiple of 256 can run the Gluon kernels.
        topk_weights, topk_ids: ``[M, top_k]``; id -1 marks an inactive route.
        activation: ``"silu"`` (silu(gate) * up), ``"gelu_tanh"`` or ``"swiglu"`` (gpt-oss: gate *
            sigmoid(1.702 gate) * (up + 1)), as :func:`moetune.kernels.activations.gated_activation`.
        swiglu_limit: optional clamp (gate above, up both sides) before silu or swiglu; gelu_tanh ignores
            it. None or a positive finite number.
        config: ``{"gate_up": {...}, "down": {...}}``, each with BLOCK_SIZE_M/N/K,
            GROUP_SIZE_M, num_warps, num_stages and the design switches DECODE, UNPACK
            (and A_LAYOUT for gate/up); a missing GEMM asks the tile picker.
        validate: also check id ranges and scale codes (syncs with the host).
        active_share: the share of top-k slots the deployment expects active, a static hint: tiles are
            picked for that many active routes (:func:`moetune.kernels.rules.picked_routes`); the result
            does not depend on it.
        w13_bias, w2_bias: optional per-expert biases (gpt-oss), bf16/fp16/fp32: ``[E, 2I]`` (gate columns,
            then up columns) added to the gate/up GEMM's output before the clamp and activation, and
            ``[E, H]`` added to the down GEMM's output (times the routing weight, as the rest of the route's
            output). Neither is touched by K padding. None: that GEMM has no bias, and no kernel reads one.
        w13_scale_max, w2_scale_max: optional ``[E, 2I]`` and ``[E, H]`` uint8, each weight row's largest
            scale code (:func:`moetune.quant.scale_row_max` of the scales as given, made once at load). The
            Gluon kernels then read them instead of passing over each tile's scales first (2-9% of a GEMM on
            the H200); None: they make that pass. The result is the same either way.
    """
    experts, inter, k1, k2 = check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                          topk_ids)
    check_activation(activation, swiglu_limit)
    check_biases(w13_bias, w2_bias, experts, inter, x.shape[1], x.device)
    check_scale_max(w13_scale_max, w2_scale_max, w13_scale, w2_scale)
    m, h = x.shape
    top_k = topk_ids.shape[1]
    routes = m * top_k
    shapes = gemm_shapes(experts, h, inter, top_k, gate_up_k=k1, down_k=k2)
    cfgs = _configs(config, shapes, picked_routes(m, top_k, active_share))
    if validate:
        _validate_values(cfgs, w13_scale, w2_scale, topk_ids, experts, w13_scale_max, w2_scale_max)
    if m == 0:
        return x.new_empty((0, h))

    # IMPL gluon reads its activations in the wgmma K order: their producers write it (no copy).
    order = {g: "wgmma" if cfgs[g]["IMPL"] == "gluon" else "real" for g in GEMMS}
    if "wgmma" in order.values():
        from moetune.kernels.fp4_prefill import gluon_gemm

        for gemm, a_k, w in (("gate_up", k1, w13_packed), ("down", k2, w2_packed)):
            if order[gemm] == "wgmma":
                gluon_gemm.check_problem(a_k, w, cfgs[gemm])
    xq, xs = act_quant(x, k_order=order["gate_up"], width=k1)
    align_gu = align_routes(topk_ids, experts, cfgs["gate_up"]["BLOCK_SIZE_M"])
    gate_up = torch.empty(routes, 2 * inter, dtype=torch.float32, device=x.device)
    grouped_gemm(xq, xs, w13_packed, w13_scale, gate_up, align_gu, a_div=top_k, config=cfgs["gate_up"],
                 a_k_order=order["gate_up"], w_scale_max=w13_scale_max)
    # Rows of inactive routes are never written here, nor read by the down GEMM.
    weights = topk_weights.reshape(-1).float()
    hq, hs = swiglu_quant(gate_up, weights, topk_ids.reshape(-1), swiglu_limit, k_order=order["down"],
                          width=k2, activation=activation, bias=w13_bias)
    bm_down = cfgs["down"]["BLOCK_SIZE_M"]
    align_dn = align_gu if bm_down == align_gu.block_m else align_routes(topk_ids, experts, bm_down)
    # inactive routes' rows: never read
    down = torch.empty(routes, h, dtype=OUT_DTYPES[cfgs["down"]["OUT_DTYPE"]], device=x.device)
    grouped_gemm(hq, hs, w2_packed, w2_scale, down, align_dn, a_div=1, config=cfgs["down"],
                 a_k_order=order["down"], w_scale_max=w2_scale_max)
    return moe_sum(down, topk_ids, x.dtype, bias=w2_bias,
                   topk_weights=None if w2_bias is None else weights.view(m, top_k))
