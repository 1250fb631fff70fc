"""H200 probe of W_TMA (fp8 decode weight tiles by TMA copies) against the tables' picks (issue 2).

For DeepSeek-V3 TP=8 (or --model/--tp), both GEMMs, at each --tokens: the picker's config ("table"),
the same config with W_TMA 1, and W_TMA 1 with one pipeline stage fewer and more. A table pick
without fp8 tensor cores (A_FP8 0, where W_TMA cannot run) is compared through its A_FP8 2 twin.
Every config is checked against the reference before it is timed (the sweep's runner: CUDA graphs,
fresh inputs); ``--rounds`` rounds, each config's fastest median kept. Writes ``w_tma.json`` and
``w_tma.md`` under --out and prints the table last.

    PYTHONPATH=. python benchmarks/w_tma.py --out $OUT/w --tokens 1 4 16 64
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
    base = dict(table) if table.get("A_FP8") else {**table, "A_FP8": 2, "num_stages": 3}
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
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = get_model(args.model)
    rows = []
    with Runner() as runner:
        for gemm in ("gate_up", "down"):
            spec = get_spec(f"fp8_decode.{gemm}")
            shape = spec.shape_from_model(model, args.tp)
            for tokens in args.tokens:
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
                    rows.append({"gemm": gemm, "tokens": tokens, "variant": name, "config": config,
                                 "status": res.get("status"), "reason": res.get("reason"),
                                 "time_ms": res.get("time_ms"), "roofline": res.get("roofline_frac")})
                    print(json.dumps(rows[-1]), flush=True)
    (out / "w_tma.json").write_text(json.dumps(rows, indent=1))
    lines = ["| GEMM | tokens | variant | us | roofline | vs table |", "|---|---:|---|---:|---:|---:|"]
    for row in rows:
        t0 = next(r["time_ms"] for r in rows
                  if (r["gemm"], r["tokens"], r["variant"]) == (row["gemm"], row["tokens"], "table"))
        t = row["time_ms"]
        ratio = f"{t0 / t:.3f}x" if t and t0 else "-"
        us = f"{t * 1e3:.2f}" if t else row["status"]
        roof = f"{row['roofline']:.1%}" if row["roofline"] else "-"
        lines.append(f"| {row['gemm']} | {row['tokens']} | {row['variant']} | {us} | {roof} | {ratio} |")
    (out / "w_tma.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
