"""The picker between table densities, checked on exhaustive stores without a GPU.

At each point an exhaustive store covers, drop that density's entries from the committed table, let the
picker's rule choose from the rest (the entry nearest in log density; a tie goes to the lower), and read
that config's time at the point from the same store: the ratio to the store's best there is what the
picker would lose if the table lacked the point. Both times come from one sweep on one machine, but
each candidate drew its own routing, which moves times by about 1-2% at these densities
(docs/tables.md). Also the best config at the neighbouring entries' densities for
comparison. Runs on the CPU, reading gzipped stores as they are:

    python tools/picker_holdout.py -k fp8_decode.gate_up -m deepseek-v3 --tp 8 \\
        --store data/sm_90/fp8_decode/15-deepseek-v3_tp8_exhaustive.sqlite.gz \\
        --store data/sm_90/fp8_decode/17-deepseek-v3_tp8_gate_up_exhaustive_full_space.sqlite.gz
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables.format import read, table_path
from moetune.tuner.store import read_frame
from moetune.tuner.sweep import full_config


def nearest(entries: list[dict], density: float) -> dict:
    """The picker's rule (moetune.tables.picker._nearest) on a list of table entries."""
    x = math.log(density)
    return min(entries, key=lambda e: (round(abs(math.log(e["density"]) - x), 9), e["density"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", "--kernel", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--store", action="append", required=True, help="an exhaustive store (repeat)")
    ap.add_argument("--configs", default="configs", help="tables root")
    ap.add_argument("--device", default="NVIDIA H200")
    ap.add_argument("--min-rows", type=int, default=1000, help="points with fewer ok rows are skipped")
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(args.model), args.tp))
    table = read(table_path(Path(args.configs), "sm_90", spec.name, shape, device=args.device))
    frames = [read_frame(s, "--store") for s in args.store]
    df = pd.concat(frames, ignore_index=True)
    df = df[(df.kernel == spec.name) & (df.status == "ok") & (df["shape"] == canonical_json(shape))
            & (df.routing == "uniform") & (df.active_fraction == 1.0)]
    df = df.assign(key=[canonical_json(full_config(spec, json.loads(c))) for c in df.config])
    rows = []
    for tokens, point in df.groupby("tokens"):
        if len(point) < args.min_rows:
            continue
        times = point.groupby("key").time_ms.min()
        density = point.routes.iloc[0] / shape["E"]
        rest = [e for e in table["entries"] if not math.isclose(e["density"], density)]
        pick = nearest(rest, density)
        key = canonical_json(full_config(spec, pick["config"]))
        t = times.get(key)
        rows.append({"tokens": tokens, "measured": len(times), "best_us": times.min() * 1e3,
                     "picked_from_tokens": pick["tokens"], "picked_us": t * 1e3 if t is not None else None,
                     "ratio": t / times.min() if t is not None else None,
                     "rank": int((times < t).sum()) + 1 if t is not None else None})
    print(f"{spec.name}, {args.model} TP{args.tp}: the picker's choice, the point's own entries left out\n")
    print("| tokens | configs measured | best us | picked from (tokens) | picked us | picked / best | rank |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        picked = f"{r['picked_us']:.2f}" if r["picked_us"] else "not measured"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        print(f"| {r['tokens']} | {r['measured']} | {r['best_us']:.2f} | {r['picked_from_tokens']} | "
              f"{picked} | {ratio} | {r['rank'] or '-'} |")


if __name__ == "__main__":
    main()
