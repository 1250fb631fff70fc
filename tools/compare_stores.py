"""Do two sweep stores hold the same candidates, with no duplicates or losses, and agree on the winners?

Usage: python tools/compare_stores.py A.sqlite B.sqlite [--out report.json]
Prints one line per store and per point, then writes the comparison as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moetune.tuner.store import Store  # noqa: E402

POINT = ["kernel", "shape", "tokens", "routes", "active_fraction", "routing"]


def load(path: Path):
    with Store(path, readonly=True) as s:
        rows = s.frame()
    return rows[rows["strategy"] != "remeasure"] if "strategy" in rows else rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    report: dict = {}
    for name, df in (("a", a), ("b", b)):
        dup = int(df.duplicated(POINT + ["config"]).sum())
        report[name] = {"rows": len(df), "duplicates": dup, "ok": int((df["status"] == "ok").sum())}
        print(f"{name}: {len(df)} rows, {dup} duplicates, {report[name]['ok']} ok")
    ka = set(map(tuple, a[POINT + ["config", "status"]].astype(str).values))
    kb = set(map(tuple, b[POINT + ["config", "status"]].astype(str).values))
    report["only_a"], report["only_b"] = len(ka - kb), len(kb - ka)
    print(f"same candidates and statuses: {ka == kb} (only in a: {len(ka - kb)}, only in b: {len(kb - ka)})")
    points = []
    for key, ga in a[a["status"] == "ok"].groupby(POINT):
        gb = b[(b["status"] == "ok")]
        for col, val in zip(POINT, key, strict=True):
            gb = gb[gb[col] == val]
        if gb.empty:
            continue
        ba, bb = ga.loc[ga["time_ms"].idxmin()], gb.loc[gb["time_ms"].idxmin()]
        # The same config's time in the other store says whether the winners differ beyond noise.
        b_of_a = gb[gb["config"] == ba["config"]]["time_ms"]
        row = {"routes": int(key[3]), "tokens": int(key[2]), "best_a_ms": float(ba["time_ms"]),
               "best_b_ms": float(bb["time_ms"]), "same_winner": ba["config"] == bb["config"],
               "a_winner_in_b_ms": float(b_of_a.iloc[0]) if len(b_of_a) else None}
        points.append(row)
        print(f"routes {row['routes']:>6} tokens {row['tokens']:>5}: best {row['best_a_ms']:.4f} vs "
              f"{row['best_b_ms']:.4f} ms, same winner {row['same_winner']}")
    report["points"] = points
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
