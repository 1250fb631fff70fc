"""H200 probe of W_TMA (weight tiles by TMA copies) against the tables' picks (issues 2 and 5).

For --family fp8_decode (DeepSeek-V3 TP=8 by default, at each --tokens) or fp4_prefill
(DeepSeek-V4-Flash TP=2 by default, at each --routes), both GEMMs: the picker's config ("table"),
the same config with W_TMA 1, and W_TMA 1 with one pipeline stage fewer and more. A fp8 table pick
without fp8 tensor cores (A_FP8 0, where W_TMA cannot run) is compared through its A_FP8 2 twin; a
fp4 pick with DECODE fp8_scaled (32-K slices, no whole tile to copy) through its fp8 twin.
Every config is checked against the reference before it is timed (the sweep's runner: CUDA graphs,
fresh inputs); ``--rounds`` rounds, each config's fastest median kept. Writes ``w_tma.json`` and
``w_tma.md`` under --out and prints the table last.

    PYTHONPATH=. python benchmarks/w_tma.py --out $OUT/w --tokens 1 4 16 64
    PYTHONPATH=. python benchmarks/w_tma.py --out $OUT/w4 --family fp4_prefill --routes 1536 6144 24576
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moetune.models import get_model
from moetune.picker import pick_config
from moetune.runner import Runner
from moetune.spec import canonical_json, get_spec


def variants(table: dict) -> dict[str, dict]:
    if "A_FP8" in table:  # fp8 decode
        base = dict(table) if table["A_FP8"] else {**table, "A_FP8": 2, "num_stages": 3}
    else:
        base = {**table, "DECODE": "fp8"} if table["DECODE"] == "fp8_scaled" else dict(table)
    out = {"table": dict(table)}
    if base != table:
        out["a_fp8_2"] = base
    tma = {**base, "W_TMA": 1}
    out["tma"] = tma
    for d in (-1, 1):
        st = tma["num_stages"] + d
        if 1 <= st <= 6:
            out[f"tma_s{st}"] = {**tma, "num_stages": st}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--family", choices=["fp8_decode", "fp4_prefill"], default="fp8_decode")
    ap.add_argument("--model", help="default: deepseek-v3 (fp8), deepseek-v4-flash (fp4)")
    ap.add_argument("--tp", type=int, help="default: 8 (fp8), 2 (fp4)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64], help="fp8 densities")
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576], help="fp4 densities")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fp8 = args.family == "fp8_decode"
    model = get_model(args.model or ("deepseek-v3" if fp8 else "deepseek-v4-flash"))
    tp = args.tp or (8 if fp8 else 2)
    rows = []
    with Runner() as runner:
        for gemm in ("gate_up", "down"):
            spec = get_spec(f"{args.family}.{gemm}")
            shape = spec.shape_from_model(model, tp)
            for tokens in args.tokens if fp8 else [r // model.top_k for r in args.routes]:
                problem = spec.problem(shape, tokens)
                vs = variants(pick_config(spec.name, shape, problem.routes, device=runner.device))
                best: dict[str, dict] = {}
                for r in range(args.rounds):
                    for config, res in runner.measure(spec, problem, list(vs.values()), seed=r):
                        key = canonical_json(config)
                        old = best.get(key, {}).get("time_ms") or float("inf")
                        if res.get("status") == "ok" and res["time_ms"] < old:
                            best[key] = res
                        best.setdefault(key, res)
                for name, config in vs.items():
                    res = best.get(canonical_json(config), {})
                    rows.append({"gemm": gemm, "tokens": tokens, "routes": problem.routes, "variant": name,
                                 "config": config, "status": res.get("status"), "reason": res.get("reason"),
                                 "time_ms": res.get("time_ms"), "roofline": res.get("roofline_frac")})
                    print(json.dumps(rows[-1]), flush=True)
    (out / "w_tma.json").write_text(json.dumps(rows, indent=1))
    where = "tokens" if fp8 else "routes"
    lines = [f"| GEMM | {where} | variant | us | roofline | vs table |", "|---|---:|---|---:|---:|---:|"]
    for row in rows:
        t0 = next(r["time_ms"] for r in rows
                  if (r["gemm"], r["tokens"], r["variant"]) == (row["gemm"], row["tokens"], "table"))
        t = row["time_ms"]
        ratio = f"{t0 / t:.3f}x" if t and t0 else "-"
        us = f"{t * 1e3:.2f}" if t else row["status"]
        roof = f"{row['roofline']:.1%}" if row["roofline"] else "-"
        lines.append(f"| {row['gemm']} | {row[where]} | {row['variant']} | {us} | {roof} | {ratio} |")
    (out / "w_tma.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
