"""PERSISTENT against the one-tile grid at the committed picks, by ``moetune bench --layer``'s method: each
GEMM alone and the whole layer with every route active, and the layer with none active (tiles picked for
every route, as a deployment sees when its routing sends a step's tokens elsewhere).

    PYTHONPATH=. python benchmarks/fp8_persistent.py --persistent 0 2 4 8 --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetune.models import get_model
from moetune.tuner.layer_bench import LayerBenchOptions, bench_layer

MODELS = (("deepseek-v3", 8), ("qwen3-30b-a3b", 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persistent", type=int, nargs="+", default=[0, 2, 4, 8])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for name, tp in MODELS:
        for p in args.persistent:
            for active in (1.0, 0.0):
                opts = LayerBenchOptions(override={"PERSISTENT": p}, hint=False)
                res = bench_layer(get_model(name), tp, args.tokens, [active], opts)
                rows += [{**r.__dict__, "persistent": p} for r in res.rows]
                for r in res.rows:
                    print(f"{name} P{p} a{active:g} t{r.tokens}: gate_up {r.gate_up_us:.1f} down "
                          f"{r.down_us:.1f} layer {r.layer_us:.1f} us", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_persistent.json").write_text(json.dumps(rows, indent=1))
    print("\nratio to PERSISTENT 0 (active: gate_up / down / layer; all inactive: layer us)")
    base = {(r["model"], r["tokens"], r["active_fraction"]): r for r in rows if r["persistent"] == 0}
    for r in rows:
        if r["persistent"] == 0:
            continue
        b = base[(r["model"], r["tokens"], r["active_fraction"])]
        if r["active_fraction"] > 0:
            gu, dn, lay = (r[k] / b[k] for k in ("gate_up_us", "down_us", "layer_us"))
            print(f"{r['model']:>14} t{r['tokens']:<4} P{r['persistent']}: {gu:.3f} / {dn:.3f} / {lay:.3f}")
        else:
            print(f"{r['model']:>14} t{r['tokens']:<4} P{r['persistent']}: idle layer {r['layer_us']:.1f} us "
                  f"(P0 {b['layer_us']:.1f})")


if __name__ == "__main__":
    main()
