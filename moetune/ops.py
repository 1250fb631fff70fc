"""The layers as ``torch.library`` custom ops in the ``moetune::`` namespace.

``import moetune.ops`` registers ``torch.ops.moetune.fp8_decode_moe``, ``torch.ops.moetune.fp4_prefill_moe``
and ``torch.ops.moetune.gather_rows_with_scales``, each with a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces a model that calls them as one opaque node each, and engines that
register their kernels as ops can register these. The functions here (``moetune.ops.fp8_decode_moe`` ...)
take the layers' arguments and call the ops.

Tile configs travel as JSON text (``""``: the layer's tile picker chooses, inside the op, so the picker
never enters a traced graph; it caches its answer per shape and route count). The ops are functional:
each returns new tensors and mutates none of its inputs (``gather_rows_with_scales`` has no ``out=``).
Nothing here syncs the host (unless ``validate=True``) or allocates outside the layers' own
``torch.empty`` calls, so the ops replay under CUDA graphs as the plain layers do.

The layer modules load on the first call, not at registration: their ``@triton.jit`` reads
``TRITON_INTERPRET`` when it runs, so a caller may still set it after ``import moetune.ops``. The ops have
no autograd formula (inference only: call them under ``torch.no_grad()`` or ``torch.inference_mode()``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from moetune.problem import canonical_json

__all__ = ["fp8_decode_moe", "fp4_prefill_moe", "gather_rows_with_scales", "config_json"]


@torch.compiler.assume_constant_result
def config_json(config: Mapping[str, Any] | str | None) -> str:
    """The ops' ``config`` text: ``""`` for None (the picker chooses), a mapping as canonical JSON, a string
    unchanged. Under ``torch.compile`` it runs at trace time and its result is a constant of the graph
    (``assume_constant_result``: dynamo cannot trace ``json.dumps``), so the config must not change between
    calls of one compiled graph."""
    if config is None:
        return ""
    if isinstance(config, str):
        return config
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be None, a mapping or its JSON text, got {type(config).__name__}")
    return canonical_json(config)


def _parse(config: str) -> dict[str, Any] | None:
    if not config:
        return None
    try:
        parsed = json.loads(config)
    except json.JSONDecodeError as e:
        raise ValueError(f"config is not valid JSON ({e}): {config!r}") from e
    if not isinstance(parsed, dict):
        raise ValueError(f"config must be a JSON object, got {config!r}")
    return parsed


# ---- fp8_decode_moe -------------------------------------------------------------------------------
@torch.library.custom_op("moetune::fp8_decode_moe", mutates_args=())
def _fp8_decode_moe_op(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                       w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                       activation: str = "silu", swiglu_limit: float | None = None, config: str = "",
                       fused: bool = False, validate: bool = False, pdl: bool | None = None,
                       active_share: float | None = None) -> torch.Tensor:
    from moetune.kernels.fp8_decode.layer import fp8_decode_moe as layer

    return layer(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation=activation,
                 swiglu_limit=swiglu_limit, config=_parse(config), fused=fused, validate=validate, pdl=pdl,
                 active_share=active_share)


@_fp8_decode_moe_op.register_fake
def _(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation="silu", swiglu_limit=None,
      config="", fused=False, validate=False, pdl=None, active_share=None):
    from moetune.kernels.fp8_decode.layer import check_inputs
    from moetune.kernels.rules import picked_routes

    picked_routes(1, 1, active_share)  # the same refusal as the real op

    m, h, *_ = check_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation,
                             swiglu_limit)
    return x.new_empty((m, h))


def fp8_decode_moe(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                   w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   activation: str = "silu", swiglu_limit: float | None = None,
                   config: Mapping[str, Any] | str | None = None, fused: bool = False, validate: bool = False,
                   pdl: bool | None = None, active_share: float | None = None) -> torch.Tensor:
    """:func:`moetune.kernels.fp8_decode.layer.fp8_decode_moe` through ``torch.ops.moetune.fp8_decode_moe``
    (same arguments; ``config`` also as its JSON text, see :func:`config_json`)."""
    return torch.ops.moetune.fp8_decode_moe(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                            activation=activation, swiglu_limit=swiglu_limit,
                                            config=config_json(config), fused=fused, validate=validate,
                                            pdl=pdl, active_share=active_share)


# ---- fp4_prefill_moe ------------------------------------------------------------------------------
@torch.library.custom_op("moetune::fp4_prefill_moe", mutates_args=())
def _fp4_prefill_moe_op(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                        w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, w13_bias: torch.Tensor | None = None,
                        w2_bias: torch.Tensor | None = None, w13_scale_max: torch.Tensor | None = None,
                        w2_scale_max: torch.Tensor | None = None, activation: str = "silu",
                        swiglu_limit: float | None = None, config: str = "",
                        validate: bool = False, active_share: float | None = None) -> torch.Tensor:
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe as layer

    return layer(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, activation=activation,
                 swiglu_limit=swiglu_limit, config=_parse(config), validate=validate, w13_bias=w13_bias,
                 w2_bias=w2_bias, active_share=active_share, w13_scale_max=w13_scale_max,
                 w2_scale_max=w2_scale_max)


@_fp4_prefill_moe_op.register_fake
def _(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids, w13_bias=None, w2_bias=None,
      w13_scale_max=None, w2_scale_max=None, activation="silu", swiglu_limit=None, config="", validate=False,
      active_share=None):
    from moetune.kernels.activations import check_activation
    from moetune.kernels.fp4_prefill.inputs import check_biases, check_inputs, check_scale_max
    from moetune.kernels.rules import picked_routes

    picked_routes(1, 1, active_share)

    experts, inter, _, _ = check_inputs(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights, topk_ids)
    check_activation(activation, swiglu_limit)
    check_biases(w13_bias, w2_bias, experts, inter, x.shape[1], x.device)
    check_scale_max(w13_scale_max, w2_scale_max, w13_scale, w2_scale)
    return x.new_empty(x.shape)


def fp4_prefill_moe(x: torch.Tensor, w13_packed: torch.Tensor, w13_scale: torch.Tensor,
                    w2_packed: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, *, activation: str = "silu", swiglu_limit: float | None = None,
                    config: Mapping[str, Any] | str | None = None, validate: bool = False,
                    w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
                    active_share: float | None = None, w13_scale_max: torch.Tensor | None = None,
                    w2_scale_max: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`moetune.kernels.fp4_prefill.layer.fp4_prefill_moe` through
    ``torch.ops.moetune.fp4_prefill_moe`` (same arguments; ``config`` also as its JSON text; the optional
    biases and row maxima are the op's ``Tensor?`` arguments after ``topk_ids``)."""
    return torch.ops.moetune.fp4_prefill_moe(x, w13_packed, w13_scale, w2_packed, w2_scale, topk_weights,
                                             topk_ids, w13_bias, w2_bias, w13_scale_max, w2_scale_max,
                                             activation=activation, swiglu_limit=swiglu_limit,
                                             config=config_json(config),
                                             validate=validate, active_share=active_share)


# ---- gather_rows_with_scales ----------------------------------------------------------------------
@torch.library.custom_op("moetune::gather_rows_with_scales", mutates_args=())
def _gather_rows_op(q: torch.Tensor, scales: torch.Tensor, dst2src: torch.Tensor, config: str = "",
                    validate: bool = False, experts: int = 1,
                    top_k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    from moetune.kernels.gather_rows.gather import gather_rows_with_scales as gather

    return gather(q, scales, dst2src, config=_parse(config), validate=validate, experts=experts, top_k=top_k)


@_gather_rows_op.register_fake
def _(q, scales, dst2src, config="", validate=False, experts=1, top_k=1):
    from moetune.kernels.gather_rows.gather import _check_inputs

    if q.device.type != "meta":  # the layer's checks refuse devices the kernel cannot run on
        _check_inputs(q, scales, dst2src)
    rows = dst2src.shape[0]
    return q.new_empty((rows, q.shape[1])), scales.new_empty((rows, scales.shape[1]))


def gather_rows_with_scales(q: torch.Tensor, scales: torch.Tensor, dst2src: torch.Tensor, *,
                            config: Mapping[str, Any] | str | None = None, validate: bool = False,
                            experts: int = 1, top_k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moetune.kernels.gather_rows.gather.gather_rows_with_scales` through
    ``torch.ops.moetune.gather_rows_with_scales``: always new output tensors (no ``out=``)."""
    return torch.ops.moetune.gather_rows_with_scales(q, scales, dst2src, config=config_json(config),
                                                     validate=validate, experts=experts, top_k=top_k)
