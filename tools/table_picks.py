"""The distinct configs of one committed table and its route counts, for sweeps that measure every pick
at every density of the table (``h200_tables.sh cross``) or at the boundaries between them (``refine``).

The picker serves a density off the table's grid with the nearest entry's config, and an entry is the
best of what its own sweep measured. A neighbour's pick may be faster at that density and never have
been tried there (V4-Flash TP2 gate/up at 3456 routes held a ``halves`` tile 0.666 ms while the picks on
either side, ``lut`` tiles, were never timed there; the picker then served it at 3840 routes, 1.15x the
direct sweep's best). Measuring every pick everywhere makes each entry at least as fast,
at its density, as any other entry's config.

That cannot help between two entries whose picks are different designs, each much slower at the other's
density: the picker serves the far one for part of the interval (7680 routes took the 9216-route BM64
tile, 1.27x the direct best, where the 6144-route BM32 tile was 4.9% off at 9216). With ``--boundaries``
the script reads those cross measurements from the given stores and prints instead the geometric
midpoints (as route counts) of the intervals where either pick is more than ``--gap`` slower at the other
entry's density: the grid points a ``refine`` sweep adds.

    python tools/table_picks.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 \\
        --starts picks.json --max-routes 24576      # prints the routes, comma-separated
    python tools/table_picks.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 \\
        --starts picks.json --max-routes 24576 \\
        --boundaries data/sm_90/fp4_prefill/18-deepseek-v4-flash_tp2_cross.sqlite.gz
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables.format import read, table_path
from moetune.tuner.store import read_frame


def cross_times(stores: list[str], kernel: str) -> dict[tuple[int, str], float]:
    """Fastest ok time of each (routes, config) of ``kernel`` (uniform routing, all routes active)."""
    times: dict[tuple[int, str], float] = {}
    for path in stores:
        df = read_frame(path)
        df = df[(df["kernel"] == kernel) & (df["status"] == "ok") & (df["routing"] == "uniform")
                & (df["active_fraction"] == 1.0)]
        for routes, config, t in zip(df["routes"], df["config"], df["time_ms"], strict=True):
            key = (int(routes), canonical_json(json.loads(config)))
            times[key] = min(times.get(key, math.inf), float(t))
    return times


def boundaries(entries: list[dict], times: dict[tuple[int, str], float], gap: float) -> list[dict]:
    """Adjacent entries whose picks differ and where either pick, measured at the other's density, is
    more than ``gap`` times the other's time there (intervals without both measurements are skipped)."""
    out = []
    for a, b in zip(entries, entries[1:], strict=False):
        ca, cb = canonical_json(a["config"]), canonical_json(b["config"])
        if ca == cb:
            continue
        pairs = [(times.get((b["routes"], ca)), times.get((b["routes"], cb))),
                 (times.get((a["routes"], cb)), times.get((a["routes"], ca)))]
        ratios = [x / y for x, y in pairs if x and y]
        if len(ratios) == 2 and max(ratios) > gap:
            tokens = round(math.sqrt(a["tokens"] * b["tokens"]))
            out.append({"routes": tokens * a["routes"] // a["tokens"], "between": (a["routes"], b["routes"]),
                        "ratios": ratios})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", "--kernel", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--configs", default="configs", help="table root")
    ap.add_argument("--starts", required=True, help="JSON file to write the distinct configs to")
    ap.add_argument("--max-routes", type=int, help="only entries up to this many routes")
    ap.add_argument("--boundaries", nargs="+", metavar="STORE",
                    help="print the route counts of the boundary intervals' midpoints, from these stores' "
                         "cross measurements, instead of the table's routes")
    ap.add_argument("--gap", type=float, default=1.05)
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    shape = spec.shape_from_model(get_model(args.model), args.tp)
    doc = read(table_path(args.configs, args.arch, args.kernel, shape))
    entries = sorted((e for e in doc["entries"] if e["routing"] == "uniform" and e["active_fraction"] == 1.0
                      and (args.max_routes is None or e["routes"] <= args.max_routes)),
                     key=lambda e: e["routes"])
    configs = list({canonical_json(e["config"]): e["config"] for e in entries}.values())
    Path(args.starts).write_text(json.dumps(configs, indent=1) + "\n")
    if args.boundaries:
        found = boundaries(entries, cross_times(args.boundaries, args.kernel), args.gap)
        for b in found:
            lo, hi = b["ratios"]
            print(f"{b['between']}: ratios {lo:.3f} / {hi:.3f} -> {b['routes']} routes", file=sys.stderr)
        print(",".join(str(b["routes"]) for b in found))
    else:
        print(",".join(str(r) for r in sorted({e["routes"] for e in entries})))


if __name__ == "__main__":
    main()
