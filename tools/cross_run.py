"""Offline: do runs on different cards (or days) agree on a point's best config? (no GPU)

``moetune export`` merges a config's rows from every pooled store by their fastest median, so where
two runs ranked configs differently the table follows whichever run measured faster. Two H200 runs
ranked the same fp8 configs 15-39% apart (docs/tables.md). This reads
stores, and for every point (kernel, shape, tokens, routes, active fraction, routing) that two or more
exhaustive sweeps each measured with at least ``--min-rows`` ok configs, it compares the configs those
sweeps share, each sweep's times over its own best (like with like):

- each sweep's own best, and how far it sits from the best in the other sweeps;
- the config the table holds for that density (``--configs``), in each sweep;
- the config whose worst ratio over the sweeps is lowest (robust across runs).

    python tools/cross_run.py \\
        data/sm_90/fp8_decode/16-deepseek-v3_tp8_gate_up_exhaustive_searched.sqlite.gz \\
        data/sm_90/fp8_decode/20-deepseek-v3_tp8_gate_up_full_space_run1.sqlite.gz \\
        data/sm_90/fp8_decode/21-deepseek-v3_tp8_gate_up_full_space_run2.sqlite.gz

Prints one table row per point; pass the stores under data/ to scan
everything.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config
from moetune.tuner.store import read_frame


def load(paths: list[str]) -> pd.DataFrame:
    frames = []
    for path in paths:
        d = read_frame(path)
        d = d[d["status"] == "ok"].copy()
        d["store"] = path
        frames.append(d)
    rows = pd.concat(frames, ignore_index=True)
    keys, shapes = [], []
    for kernel, config, shape in zip(rows["kernel"], rows["config"], rows["shape"], strict=True):
        spec = get_spec(kernel)  # as export reads them: canonical configs (missing keys at the default)
        keys.append(canonical_json(spec.canonical({**spec.default, **json.loads(config)})))
        shapes.append(canonical_json(spec.normalize_shape(json.loads(shape))))
    rows["key"], rows["shape"] = keys, shapes
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stores", nargs="+", help=".sqlite or .sqlite.gz stores")
    ap.add_argument("--min-rows", type=int, default=200, help="ok rows a sweep needs at a point to count")
    ap.add_argument("--device", default="NVIDIA H200", help="whose tables to compare with")
    ap.add_argument("--strategy", default="exhaustive", help="sweeps of this strategy only, as export's "
                    "cross-run rule ('' for every sweep)")
    args = ap.parse_args()
    rows = load(args.stores)
    if args.strategy:
        rows = rows[rows["strategy"] == args.strategy]
    point = ["kernel", "shape", "tokens", "routes", "active_fraction", "routing"]
    print("| kernel | tokens | routes | sweeps | shared | each sweep's best, worst elsewhere | table pick | "
          "robust pick |")
    print("|---|---:|---:|---:|---:|---|---|---|")
    for pt, here in rows.groupby(point, sort=True):
        sizes = here.groupby("sweep_id")["key"].nunique()
        sweeps = list(sizes[sizes >= args.min_rows].index)
        if len(sweeps) < 2:
            continue
        # a config's time in each sweep: the fastest of its repeats there; ratios to that sweep's best
        times = (here[here["sweep_id"].isin(sweeps)].groupby(["key", "sweep_id"])["time_ms"].min()
                 .unstack("sweep_id").dropna())
        if times.empty:
            continue
        ratio = times / times.min()
        worst = ratio.max(axis=1)
        own = "; ".join(f"{worst[ratio[s].idxmin()]:.3f}" for s in sweeps)
        kernel, shape, tokens, routes = pt[0], json.loads(pt[1]), pt[2], pt[3]
        spec = get_spec(kernel)
        picked = pick_config(kernel, shape, int(routes), device=args.device)
        table = canonical_json(spec.canonical({**spec.default, **picked}))
        held = f"{worst[table]:.3f}" if table in worst.index else "not shared"
        robust = worst.idxmin()
        print(f"| {kernel} | {tokens} | {routes} | {len(sweeps)} | {len(times)} | {own} | {held} | "
              f"{worst[robust]:.3f}: {robust} |")


if __name__ == "__main__":
    main()
