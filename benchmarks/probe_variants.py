"""H200 probe of one design switch against the tables' picks (issues 2 and 5).

For --family fp8_decode (DeepSeek-V3 TP=8 by default, at each --tokens) or fp4_prefill
(DeepSeek-V4-Flash TP=2 by default, at each --routes), both GEMMs: the picker's config ("table")
against the same config with the --probe switched on, and that with one pipeline stage fewer and more
(``gemv``: a grid instead).

- ``w_tma``: W_TMA 1 (weight tiles by TMA copies). A fp8 table pick without fp8 tensor cores (A_FP8 0,
  where W_TMA cannot run) is compared through its A_FP8 2 twin; a fp4 pick with DECODE fp8_scaled
  (32-K slices, no whole tile to copy) through its fp8 twin.
- ``gemv`` (fp8 only): the route GEMV without tensor cores (A_FP8 0: one launch, no activation split)
  over BLOCK_SIZE_N x BLOCK_SIZE_K x SPLIT_K x num_warps x GEMV_STAGES (1: as before; 2 and 4: the K
  loop software-pipelined through shared memory), the knobs of how it streams the weights.
- ``ahead`` (fp4 only): SCALE_AHEAD (each chunk's scales loaded a step early) and A_QUADS (``lut``'s
  activation halves loaded apart), each and both, both with the other num_warps, and a ``lut`` pick whose
  M tile exceeds its N tile swapped with the N tile widened to it (where A_QUADS applies).
- ``lut`` (fp4 only): UNPACK lut (e4m3 bytes by prmt table lookup), with DECODE fp8 where the pick's
  decode is not fp8 or fp8_row; also at twice and half the pick's BLOCK_SIZE_N, with SWAP_AB flipped,
  and with the other num_warps (4 <-> 8).

Every config is checked against the reference before it is timed (the sweep's runner: CUDA graphs,
fresh inputs); ``--rounds`` rounds, each config's fastest median kept. Writes ``<probe>.json`` and
``<probe>.md`` under --out and prints the table last.

    PYTHONPATH=. python benchmarks/probe_variants.py --out $OUT/w --tokens 1 4 16 64
    PYTHONPATH=. python benchmarks/probe_variants.py --out $OUT/w4 --family fp4_prefill \
        --routes 1536 6144 24576
    PYTHONPATH=. python benchmarks/probe_variants.py --out $OUT/l --probe lut --family fp4_prefill
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config
from moetune.tuner.backends.process import Runner


def variants(table: dict, probe: str) -> dict[str, dict]:
    out = {"table": dict(table)}
    if table.get("IMPL") == "gluon":  # the switches probed here are the Triton kernel's
        return out
    if probe == "gemv":  # one launch, no tensor cores: the route GEMV over its streaming knobs
        base = {**table, "ALGO": "route", "A_FP8": 0, "W_TMA": 0, "SWAP_AB": 0, "FUSE": 0, "PREFETCH": 0,
                "num_stages": 1}
        for bn, bk, split, warps, stages in itertools.product((16, 32, 64, 128), (128, 256, 512), (4, 8, 16),
                                                              (4, 8), (1, 2, 4)):
            out[f"gemv_n{bn}_k{bk}_s{split}_w{warps}_p{stages}"] = {
                **base, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "SPLIT_K": split, "num_warps": warps,
                "GEMV_STAGES": stages}
        return out
    if probe == "ahead":
        quads = table["UNPACK"] == "lut" and table["BLOCK_SIZE_M"] <= table["BLOCK_SIZE_N"]
        if quads:  # else "ahead" below is SCALE_AHEAD alone
            out["scale_ahead"] = {**table, "SCALE_AHEAD": 1}
            out["a_quads"] = {**table, "A_QUADS": 1}
        on = {**table, "SCALE_AHEAD": 1, "A_QUADS": int(quads)}
        out[f"{probe}_w{12 - on['num_warps']}"] = {**on, "num_warps": 12 - on["num_warps"]}
        if table["UNPACK"] == "lut" and not quads:  # the M tile swapped, the N tile widened to it: it splits
            out[f"{probe}_quads_n{table['BLOCK_SIZE_M']}"] = {**on, "SWAP_AB": 1, "A_QUADS": 1,
                                                             "BLOCK_SIZE_N": table["BLOCK_SIZE_M"]}
    elif probe == "w_tma":
        if "A_FP8" in table:  # fp8 decode
            base = dict(table) if table["A_FP8"] else {**table, "A_FP8": 2, "num_stages": 3}
        else:
            base = {**table, "DECODE": "fp8"} if table["DECODE"] == "fp8_scaled" else dict(table)
        if base != table:
            out["a_fp8_2"] = base
        on = {**base, "W_TMA": 1}
    elif probe == "lut":
        decode = table["DECODE"] if table["DECODE"] in ("fp8", "fp8_row") else "fp8"
        on = {**table, "DECODE": decode, "UNPACK": "lut", "BLOCK_SIZE_K": max(64, table["BLOCK_SIZE_K"])}
        for bn in (on["BLOCK_SIZE_N"] // 2, on["BLOCK_SIZE_N"] * 2):
            if 16 <= bn <= 256:
                out[f"{probe}_n{bn}"] = {**on, "BLOCK_SIZE_N": bn}
        out[f"{probe}_swap{1 - on['SWAP_AB']}"] = {**on, "SWAP_AB": 1 - on["SWAP_AB"]}
        # at BM128 lut needs 128 registers with 8 warps (halves 142): 16 warps an SM instead of 8
        # (results/fp4_prefill.md, session 13); a coordinate sweep from a halves pick never gets there
        out[f"{probe}_w{12 - on['num_warps']}"] = {**on, "num_warps": 12 - on["num_warps"]}
    out[probe] = on
    for d in (-1, 1):
        st = on["num_stages"] + d
        if 1 <= st <= 6:
            out[f"{probe}_s{st}"] = {**on, "num_stages": st}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--family", choices=["fp8_decode", "fp4_prefill"], default="fp8_decode")
    ap.add_argument("--probe", choices=["w_tma", "lut", "gemv", "ahead"], default="w_tma")
    ap.add_argument("--model", help="default: deepseek-v3 (fp8), deepseek-v4-flash (fp4)")
    ap.add_argument("--tp", type=int, help="default: 8 (fp8), 2 (fp4)")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64], help="fp8 densities")
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576], help="fp4 densities")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gemm", nargs="+", choices=["gate_up", "down"], default=["gate_up", "down"])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fp8 = args.family == "fp8_decode"
    if fp8 == (args.probe in ("lut", "ahead")):
        ap.error(f"--probe {args.probe} is not a {args.family} switch")
    model = get_model(args.model or ("deepseek-v3" if fp8 else "deepseek-v4-flash"))
    tp = args.tp or (8 if fp8 else 2)
    rows = []
    with Runner() as runner:
        for gemm in args.gemm:
            spec = get_spec(f"{args.family}.{gemm}")
            shape = spec.shape_from_model(model, tp)
            for tokens in args.tokens if fp8 else [r // model.top_k for r in args.routes]:
                problem = spec.problem(shape, tokens)
                vs = variants(pick_config(spec.name, shape, problem.routes, device=runner.device), args.probe)
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
    (out / f"{args.probe}.json").write_text(json.dumps(rows, indent=1))
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
    (out / f"{args.probe}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
