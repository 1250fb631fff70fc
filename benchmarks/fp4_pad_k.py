"""gpt-oss-120b's experts (E 128, hidden 2880, intermediate 2880, top_k 4; TP1) through the FP4 prefill path
as they are (K 2880: the Gluon kernels need K a multiple of 256, so the picker names Triton tiles) and with
both weight banks zero-padded along K to 3072 (``pad_mxfp4_k``: Gluon tiles, down's N 2880 with a tail N tile
at the 128-wide tiles), with the picker's configs (``config=None``), as ``fp4_prefill_moe`` picks them.

- Per GEMM: gate/up [N 5760, K 2880 / 3072] and down [N 2880, K 2880 / 3072], each through the layer's
  launch path (``grouped_gemm`` on aligned routes, the activations quantized by the layer's quantizer in the
  K order its config reads), checked against an fp32 reference of the unpadded weights (relative L2 error),
  then timed: median of ``do_bench`` runs with L2 flushed, next to triton_kernels' ``matmul_ogs`` times on an
  H200 by the same method (``TK_MS``).
- The whole MoE (``--layer``): ``fp4_prefill_moe`` with gpt-oss's swiglu (limit 7) against the reference,
  CUDA-graph timings.

Writes gemms.csv (every GEMM row, configs in full) and layer.json under --out (default $OUT), prints a table
last.

    PYTHONPATH=. python benchmarks/fp4_pad_k.py --out OUT_DIR [--routes 768 1536 ...]
        [--routing uniform zipf:1.2] [--no-layer]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
from pathlib import Path

import torch
import triton

E, H, INTER, TOP_K, PADDED = 128, 2880, 2880, 4, 3072
ROUTES = (768, 1536, 3072, 6144, 12288, 24576, 49152)
# triton_kernels' matmul_ogs (W4A16, BLOCK_N 256) on an H200, per GEMM, kernel alone, median of 30 runs with
# L2 flushed, at ROUTES
TK_MS = {"gate_up": (0.398, 0.435, 0.571, 0.655, 0.954, 1.842, 3.198),
         "down": (0.217, 0.235, 0.311, 0.350, 0.503, 0.982, 1.683)}
SWITCHES = ("SWAP_AB", "SCALE_RING", "RING_SPLIT", "MMA_HALVES", "DECODE_WARPS", "A_RESIDENT", "MAXNREG",
            "OUT_DTYPE")


def _reference(a_q, a_s, w, w_s, ids, a_div: int) -> torch.Tensor:
    """fp32 ``dequant(a[r // a_div]) @ dequant(w[expert(r)]).T`` per route (inactive rows 0), unpadded K."""
    from moetune.quant.fp8_act import dequantize_fp8_act
    from moetune.quant.mxfp4 import dequantize_mxfp4

    a = dequantize_fp8_act(a_q, a_s)
    flat = ids.flatten()
    ref = torch.zeros(flat.numel(), w.shape[1], dtype=torch.float32, device=a.device)
    for e in range(w.shape[0]):
        rows = (flat == e).nonzero().flatten()
        if rows.numel():
            ref[rows] = a[rows // a_div] @ dequantize_mxfp4(w[e], w_s[e]).T
    return ref


def _summary(cfg: dict) -> str:
    """IMPL, BLOCK_SIZE_M x N and the switches that are on ("gluon 128x128 DECODE_WARPS=4 OUT_DTYPE=bf16")."""
    on = [f"{k}={cfg[k]}" for k in SWITCHES if cfg.get(k) not in (None, 0, "fp32")]
    return " ".join([f"{cfg['IMPL']} {cfg['BLOCK_SIZE_M']}x{cfg['BLOCK_SIZE_N']}", *on])


def time_gemms(banks: dict, routes_list, routing: str, gen: torch.Generator) -> list[dict]:
    """Each GEMM of each bank at each route count, the layer's picks and launch path, checked then timed."""
    from moetune.kernels.fp4_prefill.act_quant import act_quant
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.config import gemm_shapes
    from moetune.kernels.fp4_prefill.layer import OUT_DTYPES, _configs, grouped_gemm
    from moetune.routing import make_routes

    rows = []
    torch.backends.cuda.matmul.allow_tf32 = False
    for routes in routes_list:
        m = routes // TOP_K
        ids, _ = make_routes(m, TOP_K, E, routing=routing, generator=gen, device="cuda")
        acts = {"gate_up": torch.randn(m, H, device="cuda", generator=gen).to(torch.bfloat16),
                "down": torch.randn(routes, INTER, device="cuda", generator=gen).to(torch.bfloat16)}
        a_div = {"gate_up": TOP_K, "down": 1}
        unpadded = banks["as is"]
        refs = {g: _reference(*act_quant(acts[g]), *unpadded[g], ids, a_div[g]) for g in acts}
        active = ids.flatten() >= 0
        for name, bank in banks.items():
            k = {g: bank[g][0].shape[-1] * 2 for g in bank}
            shapes = gemm_shapes(E, H, INTER, TOP_K, gate_up_k=k["gate_up"], down_k=k["down"])
            cfgs = _configs(None, shapes, routes)  # what fp4_prefill_moe runs with config=None
            for gemm, cfg in cfgs.items():
                order = "wgmma" if cfg["IMPL"] == "gluon" else "real"
                a, a_s = act_quant(acts[gemm], k_order=order, width=k[gemm])
                align = align_routes(ids, E, cfg["BLOCK_SIZE_M"])
                out = torch.full((routes, shapes[gemm]["N"]), float("nan"), device="cuda",
                                 dtype=OUT_DTYPES[cfg["OUT_DTYPE"]])
                run = functools.partial(grouped_gemm, a, a_s, *bank[gemm], out, align, a_div=a_div[gemm],
                                        config=cfg, a_k_order=order)
                run()
                torch.cuda.synchronize()
                got, ref = out[active].float(), refs[gemm][active]
                err = ((got - ref).norm() / ref.norm()).item() if torch.isfinite(got).all() else float("nan")
                ms = triton.testing.do_bench(run, return_mode="median")
                tk = TK_MS[gemm][ROUTES.index(routes)] if routes in ROUTES else None
                flops = 2 * int(active.sum()) * shapes[gemm]["N"] * unpadded[gemm][0].shape[-1] * 2  # useful
                rows.append({"routing": routing, "routes": routes, "gemm": gemm, "weights": name,
                             "N": shapes[gemm]["N"], "K": k[gemm], "ms": ms, "rel_err": err,
                             "ok": err < 1e-2, "tflops": flops / ms / 1e9,
                             "tk_ms": tk, "tk_over_ms": tk / ms if tk else None,
                             "config": _summary(cfg), "config_json": json.dumps(cfg, sort_keys=True)})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "config_json"}), flush=True)
    return rows


def time_layer(banks: dict, routes_list, gen: torch.Generator) -> list[dict]:
    """The whole MoE with gpt-oss's activation, each bank, against the reference; CUDA-graph timings."""
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.models import PRESETS
    from moetune.routing import make_routes

    model = PRESETS["gpt-oss-120b"]
    act = {"activation": model.activation, "swiglu_limit": model.swiglu_limit}
    flat = {name: (*bank["gate_up"], *bank["down"]) for name, bank in banks.items()}
    rows = []
    for routes in routes_list:
        m = routes // TOP_K
        x = torch.randn(m, H, device="cuda", generator=gen).to(torch.bfloat16)
        ids, wts = make_routes(m, TOP_K, E, device="cuda", generator=gen)
        ref = fp4_prefill_moe_reference(x, *flat["as is"], wts, ids, **act).double()
        for name, bank in flat.items():
            run = functools.partial(fp4_prefill_moe, x, *bank, wts, ids, **act)
            out = run().double()
            err = ((out - ref).norm() / ref.norm()).item()
            ms = triton.testing.do_bench_cudagraph(run)
            rows.append({"routes": routes, "weights": name, "K": bank[0].shape[-1] * 2, "ms": ms,
                         "rel_err": err})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "pad_k_out")))
    ap.add_argument("--routes", type=int, nargs="+", default=list(ROUTES))
    ap.add_argument("--routing", nargs="+", default=["uniform"])
    ap.add_argument("--no-layer", dest="layer", action="store_false")
    args = ap.parse_args()

    from moetune.quant import pad_mxfp4_k, quantize_mxfp4

    gen = torch.Generator("cuda").manual_seed(0)
    w13 = quantize_mxfp4(torch.randn(E, 2 * INTER, H, device="cuda", generator=gen).to(torch.bfloat16) * 0.05)
    w2 = quantize_mxfp4(torch.randn(E, H, INTER, device="cuda", generator=gen).to(torch.bfloat16) * 0.05)
    banks = {"as is": {"gate_up": w13, "down": w2},
             "padded": {"gate_up": pad_mxfp4_k(*w13, PADDED), "down": pad_mxfp4_k(*w2, PADDED)}}
    gemms = [r for routing in args.routing for r in time_gemms(banks, args.routes, routing, gen)]
    layer = time_layer(banks, args.routes, gen) if args.layer else []

    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "gemms.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(gemms[0]))
        writer.writeheader()
        writer.writerows(gemms)
    (args.out / "layer.json").write_text(json.dumps(layer, indent=1))
    if layer:
        print("\n| routes | weights | K | layer ms | rel. error |\n|---:|---|---:|---:|---:|")
        for r in layer:
            print(f"| {r['routes']} | {r['weights']} | {r['K']} | {r['ms']:.4f} | {r['rel_err']:.2e} |")
    print("\n| routing | GEMM | routes | as is ms | padded ms | padded config | rel. error | "
          "triton_kernels ms | tk / padded |\n|---|---|---:|---:|---:|---|---:|---:|---:|")
    by = {(r["routing"], r["gemm"], r["routes"], r["weights"]): r for r in gemms}
    for routing in args.routing:
        for gemm in ("gate_up", "down"):
            for routes in args.routes:
                a, p = by[routing, gemm, routes, "as is"], by[routing, gemm, routes, "padded"]
                tk = f"{p['tk_ms']:.3f} | {p['tk_over_ms']:.2f}" if p["tk_ms"] else "- | -"
                flag = "" if a["ok"] and p["ok"] else " FAILED CHECK"
                print(f"| {routing} | {gemm} | {routes} | {a['ms']:.4f} | {p['ms']:.4f} | {p['config']} | "
                      f"{max(a['rel_err'], p['rel_err']):.1e}{flag} | {tk} |")


if __name__ == "__main__":
    main()
