"""Live check: the default strategy against an exhaustive sweep of the same point, on a GPU.

Both search the same candidates (the job's slice, as the replay data does) with the default's own
budget rule (a tenth of them), and both start from an empty Triton cache and their own store, so
each wall time includes its compiles. (Unconfined, the default's tenth of DeepSeek-V3's 14k-candidate
gate/up space is ~1.4k measurements, as many as the whole slice.) The default's winner (the config
`moetune export` would pick from its store) is looked up in the exhaustive store too: its time
there, over the exhaustive best, is the quality reported (same measurement conditions for both).

    PYTHONPATH=. python benchmarks/strategy_live_check.py --out $OUT/live \\
        --job "deepseek-v3:8:fp8_decode.gate_up:tokens=8:$SLICE" [--gpus all] [--exhaustive-s 400] \\
        [--only default|exhaustive]

With ``--only`` the two sides can run in separate calls (one device call each), into the same --out.
A side stopped by --exhaustive-s resumes when run again on the same --out (copy its store and
wall_*.json back there): its wall time is then the sum of its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reference_dataset import parse_job

from moetune.problem import canonical_json
from moetune.tuner.store import Store
from moetune.tuner.strategies import DEFAULT_STRATEGY


def run(cmd: list[str], cache: str, log: Path) -> float:
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    t0 = time.monotonic()
    with log.open("w") as f:
        subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - t0


def ok_rows(db: Path, kernel: str):
    store = Store(db, create=False, readonly=True)
    try:
        rows = store.frame(kernel=kernel)
    finally:
        store.close()
    rows = rows[rows["status"] == "ok"]
    return rows.groupby("config")["time_ms"].median()  # a config timed twice (re-measured): its median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--job", required=True, help="one point, reference_dataset.py's job syntax")
    ap.add_argument("--gpus", default=None)
    ap.add_argument("--exhaustive-s", type=float, default=400.0)
    ap.add_argument("--only", choices=("default", "exhaustive"),
                    help="run one side (its wall time kept in --out); the check is made once both are there")
    args = ap.parse_args()
    job = parse_job(args.job)
    density = [("tokens", job["tokens"])] if "tokens" in job else [("routes", job["routes"])]
    (_, values), = density
    if len(values) != 1:
        ap.error("--job must name one density")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = ["--gpus", args.gpus] if args.gpus else []
    here = Path(__file__).resolve().parent
    def search(strategy: str) -> list[str]:
        return [sys.executable, str(here / "reference_dataset.py"), "--db", str(out / f"{strategy}.sqlite"),
                "--job", args.job, "--budget-s", str(args.exhaustive_s), "--remeasure", "0",
                "--strategy", strategy, "--out", str(out / f"{strategy}_points.json"), *gpus]
    for side, strategy in (("default", DEFAULT_STRATEGY), ("exhaustive", "exhaustive")):
        if args.only in (None, side):
            with tempfile.TemporaryDirectory() as cache:  # each side compiles from an empty Triton cache
                wall = run(search(strategy), cache, out / f"{side}.log")
            # a side cut short by --exhaustive-s resumes on the next run: its wall time is the sum
            walls = out / f"wall_{side}.json"
            runs = json.loads(walls.read_text())["runs"] if walls.exists() else []
            walls.write_text(json.dumps({"wall_s": sum(runs) + wall, "runs": [*runs, wall]}))
    if not all((out / f"wall_{side}.json").exists() for side in ("default", "exhaustive")):
        return
    wall_default, wall_exhaustive = (json.loads((out / f"wall_{side}.json").read_text())["wall_s"]
                                     for side in ("default", "exhaustive"))
    mine = ok_rows(out / f"{DEFAULT_STRATEGY}.sqlite", job["kernel"])
    every = ok_rows(out / "exhaustive.sqlite", job["kernel"])
    winner = mine.idxmin()
    best = every.min()
    quality = every.get(winner, mine[winner]) / best  # the default config sits in both stores
    points = json.loads((out / "exhaustive_points.json").read_text())
    result = {
        "job": args.job, "strategy": DEFAULT_STRATEGY, "default_measured": int(len(mine)),
        "exhaustive_measured": int(len(every)),
        "exhaustive_complete": all(p.get("complete") for p in points if "point" in p),
        "wall_default_s": round(wall_default, 1), "wall_exhaustive_s": round(wall_exhaustive, 1),
        "wall_ratio": round(wall_default / wall_exhaustive, 3), "winner": json.loads(winner),
        "best": json.loads(every.idxmin()),
        "best_ms": float(best), "quality": round(float(quality), 4),
    }
    (out / "live_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("winner", "best")}))
    print(f"winner {canonical_json(result['winner'])}\nbest   {canonical_json(result['best'])}")


if __name__ == "__main__":
    main()
