"""gpt-oss-120b's experts (E 128, hidden 2880, intermediate 2880, top_k 4: K not a multiple of 256, so the
Gluon kernels cannot run them) through ``fp4_prefill_moe`` as they are (the tables' Triton tiles) and with
both weight banks zero-padded along K to 3072 (``pad_mxfp4_k``: the picker's sm_90 heuristic then names Gluon
tiles where N allows), with gpt-oss's activation (the preset's swiglu, limit 7). Each output is checked
against the reference first (relative L2 error); CUDA-graph timings of the whole MoE. Writes pad_k.json
under --out, prints a table last.

    PYTHONPATH=. python benchmarks/fp4_pad_k.py --out OUT_DIR --routes 1536 6144 24576
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
import triton

E, H, INTER, TOP_K, PADDED = 128, 2880, 2880, 4, 3072


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("pad_k_out"))
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576])
    args = ap.parse_args()

    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
    from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference
    from moetune.models import PRESETS
    from moetune.quant import pad_mxfp4_k, quantize_mxfp4
    from moetune.routing import make_routes
    from moetune.tables.picker import pick_config

    model = PRESETS["gpt-oss-120b"]
    act = {"activation": model.activation, "swiglu_limit": model.swiglu_limit}
    torch.manual_seed(0)
    w13 = quantize_mxfp4(torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16) * 0.05)
    w2 = quantize_mxfp4(torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16) * 0.05)
    banks = {"as is": (*w13, *w2), "padded": (*pad_mxfp4_k(*w13, PADDED), *pad_mxfp4_k(*w2, PADDED))}
    rows = []
    for routes in args.routes:
        m = routes // TOP_K
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        ids, wts = make_routes(m, TOP_K, E, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        ref = fp4_prefill_moe_reference(x, *banks["as is"], wts, ids, **act).double()
        for name, bank in banks.items():
            k = bank[0].shape[-1] * 2
            picks = {g: pick_config(f"fp4_prefill.{g}", {"E": E, "N": n, "K": kk, "top_k": TOP_K}, routes)
                     for g, n, kk in (("gate_up", 2 * INTER, k), ("down", H, bank[2].shape[-1] * 2))}
            run = functools.partial(fp4_prefill_moe, x, *bank, wts, ids, **act)
            out = run().double()
            err = ((out - ref).norm() / ref.norm()).item()
            ms = triton.testing.do_bench_cudagraph(run)
            rows.append({"routes": routes, "weights": name, "K": k, "ms": ms, "rel_err": err,
                         "impl": {g: c.get("IMPL") for g, c in picks.items()}, "configs": picks})
            print(json.dumps(rows[-1], default=str), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pad_k.json").write_text(json.dumps(rows, indent=1, default=str))
    print("| routes | weights | K | ms | rel. error | gate/up, down IMPL |\n|---:|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['routes']} | {r['weights']} | {r['K']} | {r['ms']:.4f} | {r['rel_err']:.2e} "
              f"| {r['impl']['gate_up']}, {r['impl']['down']} |")


if __name__ == "__main__":
    main()
