"""``moetune bench --layer``: the FP8 decode GEMMs and the whole layer, timed by the method peers quote.

Method (issue-tracker peer figures use it, so the numbers compare): one CUDA graph of ``copies``
launches, each on its own copy of the weight banks with its own routing and activations (no weight reuse
from L2 between launches); the median of ``replays`` replays divided by ``copies``. Configs are the
picker's (``config=None``: the committed tables), launched with PDL as :func:`fp8_decode_moe` launches
them on the device.

- per GEMM, kernel alone: the spec's own launch (``KernelSpec.run``, the function the tuner times),
  with the route alignment and the A_FP8 2 split made beforehand, as the layer shares or fuses them;
- layer: :func:`moetune.kernels.fp8_decode.layer.decode_moe_into`, the launches of ``fp8_decode_moe``,
  checked against the fp32 reference on the first copy before it is timed.

The layer picks its tiles for the active routes it is told to expect (``active_share``); a point whose
routing is partly inactive is timed with the hint set to its true share, as a deployment that knows it
would launch it (``hint=False``: picked for every route, as without the hint).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from moetune.models import ModelPreset
from moetune.problem import canonical_json

TOLERANCE = 1e-2  # the layer's relative error against the fp32 reference (the GEMM specs' tolerance)


@dataclass(frozen=True)
class LayerBenchOptions:
    copies: int = 16  # launches per graph, each on its own weights and routing
    replays: int = 60  # timed graph replays; the median is kept
    warmup: int = 3
    seed: int = 0
    hint: bool = True  # the layer told the point's active share (``active_share``); False: picked for all
    override: dict[str, Any] = field(default_factory=dict)  # keys set in both GEMMs' picked configs

    def __post_init__(self) -> None:
        for name in ("copies", "replays"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class LayerRow:
    """One point: times in microseconds per launch, the configs used, the layer's error."""

    model: str
    tp: int
    tokens: int
    active_fraction: float
    gate_up_us: float
    down_us: float
    layer_us: float
    error: float
    gate_up_config: str
    down_config: str


@dataclass
class LayerBenchResult:
    rows: list[LayerRow] = field(default_factory=list)
    device: str = ""
    options: LayerBenchOptions = field(default_factory=LayerBenchOptions)

    def frame(self):
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows])


def graph_us(fns: Sequence[Callable[[], None]], opts: LayerBenchOptions) -> float:
    """Microseconds per launch: ``fns`` captured once each, in order, into one CUDA graph; the median
    of ``opts.replays`` replays divided by ``len(fns)``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    for _ in range(opts.warmup):
        graph.replay()
    pairs = []
    for _ in range(opts.replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) * 1e3 / len(fns)


@dataclass
class _Copy:
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def _weights(model: ModelPreset, tp: int, copies: int, seed: int) -> list[_Copy]:
    from moetune.specs.registry import get_spec

    gu, dn = get_spec("fp8_decode.gate_up"), get_spec("fp8_decode.down")
    out = []
    for i in range(copies):
        a = gu.make_weights(gu.problem(gu.shape_from_model(model, tp), 1), "cuda", seed + 2 * i)
        b = dn.make_weights(dn.problem(dn.shape_from_model(model, tp), 1), "cuda", seed + 2 * i + 1)
        out.append(_Copy(a["w"], a["w_scale"], b["w"], b["w_scale"]))
    return out


def _gemm_us(gemm: str, model: ModelPreset, tp: int, tokens: int, frac: float, config: dict,
             copies: list[_Copy], opts: LayerBenchOptions) -> float:
    """The spec's launch of one GEMM, kernel alone, over every weight copy."""
    from moetune.specs.registry import get_spec

    spec = get_spec(f"fp8_decode.{gemm}")
    problem = spec.problem(spec.shape_from_model(model, tp), tokens, frac)
    fns = []
    for i, c in enumerate(copies):
        w = {"w": c.w13, "w_scale": c.w13_scale} if gemm == "gate_up" else {"w": c.w2, "w_scale": c.w2_scale}
        inputs = spec.make_inputs(problem, "cuda", opts.seed + 100 + i, weights=w)
        inputs.extra["kernel_only"] = True
        spec.run(inputs, config)  # makes the alignment, split and partials the timed launches reuse
        fns.append(lambda inputs=inputs: spec.run(inputs, config))
    return graph_us(fns, opts)


def bench_layer(model: ModelPreset, tp: int, tokens: Sequence[int], active: Sequence[float] = (1.0,),
                opts: LayerBenchOptions | None = None,
                on_progress: Callable[[int, int, str], None] | None = None) -> LayerBenchResult:
    """Per-GEMM and layer times of ``model`` at ``tp`` over ``tokens`` x ``active`` on the current GPU."""
    from moetune.kernels.fp8_decode.config import check_gemm_config, gemm_shapes
    from moetune.kernels.fp8_decode.layer import decode_moe_into, layer_buffers, resolve_config
    from moetune.kernels.fp8_decode.pdl import resolve_pdl
    from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
    from moetune.kernels.rules import picked_routes
    from moetune.routing import make_routes

    opts = opts or LayerBenchOptions()
    if not torch.cuda.is_available():
        raise ValueError("bench --layer times CUDA graphs: it needs a GPU")
    if model.weight_format not in ("fp8_block", "bf16"):
        raise ValueError(f"bench --layer runs the fp8 decode layer; {model.name} has {model.weight_format} "
                         "experts")
    e, inter = model.per_rank(tp)
    shapes = gemm_shapes(e, model.hidden, inter, model.top_k, "bfloat16")
    copies = _weights(model, tp, opts.copies, opts.seed)
    result = LayerBenchResult(device=torch.cuda.get_device_name(), options=opts)
    points = [(t, f) for t in tokens for f in active]
    gen = torch.Generator(device="cuda").manual_seed(opts.seed)
    pdl = resolve_pdl(None, copies[0].w13)
    for n, (t, f) in enumerate(points):
        if on_progress is not None:
            on_progress(n, len(points), f"t{t} a{f:g}")
        cfg = resolve_config(None, shapes, picked_routes(t, model.top_k, f if opts.hint else None),
                             idle=opts.hint and f == 0)
        cfg = {g: check_gemm_config({**c, **opts.override}, f"{g} with override") for g, c in cfg.items()}
        runs, ref_args = [], None
        for c in copies:
            ids, rw = make_routes(t, model.top_k, e, active_fraction=f, generator=gen, device="cuda",
                                  typical=True)
            x = torch.randn(t, model.hidden, generator=gen, device="cuda").to(torch.bfloat16)
            bufs = layer_buffers(t, model.top_k, model.hidden, inter, x.dtype, cfg, x.device)
            args = (x, c.w13, c.w13_scale, c.w2, c.w2_scale, rw, ids)
            ref_args = ref_args or args
            runs.append(lambda args=args, bufs=bufs, cfg=cfg: decode_moe_into(
                *args, cfg, bufs, model.activation, model.swiglu_limit, pdl))
        got = runs[0]().float()
        want = fp8_decode_moe_reference(*ref_args, activation=model.activation,
                                        swiglu_limit=model.swiglu_limit).float()
        err = float((got - want).norm() / want.norm().clamp_min(1e-30)) if want.norm() > 0 \
            else float(got.abs().max())
        if not err <= TOLERANCE:
            raise RuntimeError(f"{model.name} tp{tp} t{t} a{f:g}: layer error {err:.3g} over {TOLERANCE}")
        layer = graph_us(runs, opts)
        gu = _gemm_us("gate_up", model, tp, t, f, cfg["gate_up"], copies, opts)
        dn = _gemm_us("down", model, tp, t, f, cfg["down"], copies, opts)
        result.rows.append(LayerRow(model.name, tp, t, f, gu, dn, layer, err,
                                    canonical_json(cfg["gate_up"]), canonical_json(cfg["down"])))
    if on_progress is not None:
        on_progress(len(points), len(points), "")
    return result
