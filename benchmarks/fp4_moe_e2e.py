"""The whole FP4 prefill MoE (``fp4_prefill_moe``: activation quantization, alignment, gate/up GEMM, the
gated activation and its quantization, down GEMM, the sum over top_k) timed end to end with the tables'
picks, and two steps alone against what they replaced: ``moe_sum`` (zeroing the fp32 per-route buffer the
down GEMM writes, ``view(m, top_k, h).sum(1)``, the cast) and the input's quantizer ``act_quant`` (torch's
``quantize_fp8_act``, both writing the Gluon K order). A preset's rank at ``--tp`` (default DeepSeek-V4-Flash
TP 2: E 256, hidden 4096, 1024 intermediate a rank, top_k 6), its activation, weights padded along K to a
multiple of 256 as a loader would (``pad_mxfp4_k``; gpt-oss-120b: 2880 -> 3072), uniform routing; CUDA-graph
timings (``triton.testing.do_bench_cudagraph``), the layer with the weights' stored row maxima
(``scale_row_max``, as a loader gives them) and without. Writes e2e.json under --out, prints a table last.

    PYTHONPATH=. python benchmarks/fp4_moe_e2e.py --out OUT_DIR --routes 1536 6144 24576 [--profile]
    PYTHONPATH=. python benchmarks/fp4_moe_e2e.py -m gpt-oss-120b --tp 1 --out OUT_DIR

``--profile`` adds each point's GPU kernels (torch.profiler: time per kernel over 5 calls) under --out.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import triton


@dataclass(frozen=True)
class Layer:
    """One rank's MoE shape and activation."""

    experts: int
    hidden: int
    inter: int
    top_k: int
    act: dict

    @classmethod
    def of(cls, model_name: str, tp: int) -> Layer:
        from moetune.models import get_model

        model = get_model(model_name)
        experts, inter = model.per_rank(tp, 1)
        return cls(experts, model.hidden, inter, model.top_k,
                   {"activation": model.activation, "swiglu_limit": model.swiglu_limit})


def weights(layer: Layer) -> tuple[tuple, tuple]:
    """Random MXFP4 gate/up and down banks, padded along K as a loader would for the Gluon kernels."""
    from moetune.kernels.fp4_prefill.config import padded_k
    from moetune.quant.mxfp4 import pad_mxfp4_k, quantize_mxfp4

    e, h, i = layer.experts, layer.hidden, layer.inter
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * 0.05)
    return pad_mxfp4_k(*w13, padded_k(h)), pad_mxfp4_k(*w2, padded_k(i))


def row_max(w13, w2) -> dict:
    """fp4_prefill_moe's stored row maxima, as a loader makes them once (``scale_row_max``)."""
    from moetune.quant import scale_row_max

    return {"w13_scale_max": scale_row_max(w13[1]), "w2_scale_max": scale_row_max(w2[1])}


def layer_inputs(layer: Layer, routes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 tokens, their top_k expert ids and routing weights (uniform routing, a fixed seed)."""
    from moetune.routing import make_routes

    m = routes // layer.top_k
    x = torch.randn(m, layer.hidden, device="cuda", dtype=torch.bfloat16)
    ids, wts = make_routes(m, layer.top_k, layer.experts, device="cuda",
                           generator=torch.Generator("cuda").manual_seed(1))
    return x, ids, wts


def point(layer: Layer, routes: int, w13, w2, smax: dict) -> dict:
    from moetune.kernels.fp4_prefill.act_quant import act_quant
    from moetune.kernels.fp4_prefill.config import padded_k
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.moe_sum import moe_sum
    from moetune.quant import quantize_fp8_act

    m = routes // layer.top_k
    x, ids, wts = layer_inputs(layer, routes)
    down = torch.randn(routes, layer.hidden, device="cuda")
    act = layer.act
    xp = torch.nn.functional.pad(x, (0, padded_k(layer.hidden) - layer.hidden))  # the quantizers' own width

    def replaced():
        torch.zeros_like(down)
        return down.view(m, layer.top_k, layer.hidden).sum(dim=1).to(torch.bfloat16)

    bench = triton.testing.do_bench_cudagraph
    moe_ms, mode = {}, "cuda graph"
    for name, kwargs in (("moe_ms", {**act, **smax}), ("moe_pass_ms", act)):
        try:
            moe_ms[name] = bench(lambda kwargs=kwargs: fp4_prefill_moe(x, *w13, *w2, wts, ids, **kwargs))
        except RuntimeError as e:  # not capturable: timed with its launch overhead, and said so
            print(f"capture failed ({str(e)[:200]}): do_bench", flush=True)
            moe_ms[name] = triton.testing.do_bench(
                lambda kwargs=kwargs: fp4_prefill_moe(x, *w13, *w2, wts, ids, **kwargs))
            mode = "do_bench"
    return {"routes": routes, **moe_ms, "moe_timing": mode,
            "sum_replaced_ms": bench(replaced),
            "moe_sum_ms": bench(lambda: moe_sum(down, ids, torch.bfloat16)),
            "quant_torch_ms": bench(lambda: quantize_fp8_act(xp, k_order="wgmma")),
            "act_quant_ms": bench(lambda: act_quant(xp, k_order="wgmma"))}


def kernel_times(layer: Layer, routes: int, w13, w2, smax: dict, calls: int = 5) -> str:
    """torch.profiler's table of the GPU kernels of ``calls`` calls of fp4_prefill_moe (after a warm-up)."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe

    x, ids, wts = layer_inputs(layer, routes)
    act = {**layer.act, **smax}
    fp4_prefill_moe(x, *w13, *w2, wts, ids, **act)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fp4_prefill_moe(x, *w13, *w2, wts, ids, **act)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=20)
    return f"{routes} routes, {calls} calls\n{table}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("e2e_out"))
    ap.add_argument("-m", "--model", default="deepseek-v4-flash")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576])
    ap.add_argument("--profile", action="store_true",
                    help="also the GPU time of each kernel of fp4_prefill_moe (torch.profiler), per point")
    args = ap.parse_args()

    torch.manual_seed(0)
    layer = Layer.of(args.model, args.tp)
    w13, w2 = weights(layer)
    smax = row_max(w13, w2)
    rows = []
    for routes in args.routes:
        rows.append(point(layer, routes, w13, w2, smax))
        print(json.dumps(rows[-1]), flush=True)
        if args.profile:
            args.out.mkdir(parents=True, exist_ok=True)
            table = kernel_times(layer, routes, w13, w2, smax)
            (args.out / f"kernels_{routes}.txt").write_text(table)
            print(table, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "e2e.json").write_text(json.dumps(rows, indent=1))
    print("| routes | fp4_prefill_moe ms | without row maxima ms | zeros + sum + cast ms | moe_sum ms "
          "| quantize_fp8_act ms | act_quant ms |\n|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['routes']} | {r['moe_ms']:.4f} | {r['moe_pass_ms']:.4f} | {r['sum_replaced_ms']:.4f} "
              f"| {r['moe_sum_ms']:.4f} | {r['quant_torch_ms']:.4f} | {r['act_quant_ms']:.4f} |")


if __name__ == "__main__":
    main()
