"""How well does a sweep scale over the GPUs of one host? The same sweep, run several ways.

Each mode is the ``moetune sweep`` command a user types, in its own process, with its own store and
its own empty Triton cache (so each pays its own compiles, as a first sweep on a host does):

- ``one``: ``--gpus 0``: one GPU, every point at once (the multi-point driver; also what no
  ``--gpus`` does on a GPU host);
- ``all``: ``--gpus all``: one measuring worker per GPU;
- ``ray``: ``--ray``: a local Ray cluster, one actor per GPU;
- ``one-pf``, ``all-pf``: ``one`` and ``all`` with ``--prefetch`` (compiling the search's guesses ahead);
- ``one-share``: ``one`` with only its share of the host's cores compiling (cores / GPUs - 1), as on a
  one-GPU machine of the same build: the baseline for how a sweep scales when each GPU brings its
  CPUs (Ray over several machines), since on one host a second GPU adds no compile capacity.

Reports wall time, time to the first stored row, rows, duplicates and statuses per mode, and how busy
the measuring workers were (the sweep's own report); scaling efficiency = t(one) / (n * t(n GPUs)), and
against ``one-share`` where it ran; per point, each mode's best time against the ``one`` run's
(do the tables agree?). Writes ``scaling.json`` and each mode's store and log under ``--out`` and
prints a table last. ``--smoke`` runs it on the tiny model through the interpreter.

    python benchmarks/multi_gpu_scaling.py --out $OUT --modes one,all,ray \\
        -- -m deepseek-v4-flash --tp 1 -k fp4_prefill.gate_up --routes 768,1536,3072,6144,12288,24576 \\
        --budget 24
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

POINT = ["kernel", "shape", "tokens", "routes", "active_fraction", "routing"]
FLAGS = {"one": ["--gpus", "0"], "all": ["--gpus", "all"], "ray": ["--ray"],
         "one-pf": ["--gpus", "0", "--prefetch"], "all-pf": ["--gpus", "all", "--prefetch"],
         "one-share": ["--gpus", "0"]}  # plus --jobs, its share of the cores, once the GPUs are counted


def gpus_of(mode: str, count: int) -> int:
    return count if mode.split("-")[0] in ("all", "ray") else 1


def load(db: Path):
    from moetune.tuner.store import Store

    with Store(db, readonly=True) as s:
        return s.frame()


def summarize(mode: str, db: Path, wall: float, started: dt.datetime) -> dict:
    rows = load(db)
    searched = rows[rows["strategy"] != "remeasure"]
    stamps = rows["timestamp"].map(dt.datetime.fromisoformat)
    return {"mode": mode, "wall_s": round(wall, 1),
            "first_row_s": round((stamps.min() - started).total_seconds(), 1) if len(rows) else None,
            "last_row_s": round((stamps.max() - started).total_seconds(), 1) if len(rows) else None,
            "rows": len(rows), "duplicates": int(searched.duplicated(POINT + ["config"]).sum()),
            "statuses": searched["status"].value_counts().to_dict()}


def best_per_point(db: Path) -> dict[str, tuple[float, str]]:
    rows = load(db)
    ok = rows[rows["status"] == "ok"]
    best = {}
    for key, g in ok.groupby(POINT):
        mean = g.groupby("config")["time_ms"].mean()  # remeasured configs: their mean, as export does
        best[json.dumps([str(k) for k in key])] = (float(mean.min()), str(mean.idxmin()))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default="one,all,ray")
    ap.add_argument("--limit-s", type=float, default=300, help="per mode: kill a sweep running longer")
    ap.add_argument("--smoke", action="store_true", help="tiny model, interpreter, no --gpus (the CLI's "
                    "--gpus needs a GPU): checks this script")
    ap.add_argument("sweep", nargs="*", help="arguments for moetune sweep (after --)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    sweep = args.sweep or ["-m", "deepseek-v4-flash", "--tp", "1", "-k", "fp4_prefill.gate_up",
                           "--routes", "768,1536,3072,6144,12288,24576", "--budget", "24"]
    if args.smoke:
        env["TRITON_INTERPRET"] = "1"
        sweep = ["-m", "tiny", "-k", "fp8_decode.gate_up", "--tokens", "1,2", "--active", "1",
                 "--budget", "3"]
        args.modes = "cpu"
    count = 0 if args.smoke else int(subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True, text=True, env=env).stdout.strip() or 0)
    runs = []
    unknown = [m for m in args.modes.split(",") if m not in FLAGS and not args.smoke]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; known: {sorted(FLAGS)}")
    for mode in args.modes.split(","):
        flags = FLAGS.get(mode, [])
        if mode == "one-share":
            flags = ["--gpus", "0", "--jobs", str(max(1, (os.cpu_count() or 2) // max(count, 1) - 1))]
        db = args.out / f"{mode}.sqlite"
        db.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "moetune", "sweep", *sweep, "--seed", "0", "--db", str(db), "--quiet",
               "--verbose", *flags]
        started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"tc_{mode}_") as cache:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.limit_s,
                                      env={**env, "TRITON_CACHE_DIR": cache})
                log, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:
                log, rc = f"{e.stdout or ''}{e.stderr or ''}\nkilled after {args.limit_s} s", "timeout"
        wall = time.monotonic() - t0
        (args.out / f"{mode}.log").write_text(" ".join(cmd) + "\n" + str(log))
        print(f"== {mode}: rc {rc}, {wall:.1f} s\n{str(log)[-1500:]}", flush=True)
        if db.exists():
            busy = re.search(r"measuring workers busy (\d+)%", str(log))
            runs.append({**summarize(mode, db, wall, started), "rc": rc, "gpus": gpus_of(mode, count),
                         "flags": flags, "busy": int(busy.group(1)) / 100 if busy else None})

    by_mode = {r["mode"]: r for r in runs}
    bests = {r["mode"]: best_per_point(args.out / f"{r['mode']}.sqlite") for r in runs}
    for r in runs:  # against the one-GPU run with the same options (-pf: with --prefetch)
        base = by_mode.get("one" + r["mode"][len(r["mode"].split("-")[0]):])
        if base and r["gpus"] > 1:
            r["efficiency"] = round(base["wall_s"] / (r["gpus"] * r["wall_s"]), 3)
        if "one-share" in by_mode and r["gpus"] > 1:
            r["efficiency_vs_share"] = round(by_mode["one-share"]["wall_s"] / (r["gpus"] * r["wall_s"]), 3)
        if "one" in bests:  # each point's best against the one-GPU run's best
            mine = bests[r["mode"]]
            ratios = [mine[k][0] / t for k, (t, _) in bests["one"].items() if k in mine]
            same = [mine[k][1] == c for k, (_, c) in bests["one"].items() if k in mine]
            r["best_vs_one"] = [round(x, 4) for x in ratios]
            r["same_winner"] = sum(same)
    (args.out / "scaling.json").write_text(json.dumps({"sweep": sweep, "gpus_seen": count, "runs": runs,
                                                       "bests": bests}, indent=1, default=str))
    print(f"\nmoetune sweep {' '.join(sweep)}  (GPUs on this host: {count}; each mode with an empty Triton "
          "cache)")
    print(f"{'mode':9} {'gpus':>4} {'wall s':>7} {'1st row s':>9} {'rows':>5} {'dup':>4} {'ok':>4} "
          f"{'eff':>5} {'eff/sh':>6} {'busy':>5} {'best/one min..max':>18} {'same winner':>11}")
    for r in runs:
        ratios = r.get("best_vs_one") or []
        span = f"{min(ratios):.3f}..{max(ratios):.3f}" if ratios else "-"
        eff, share, busy = (f"{r[k]:.0%}" if r.get(k) is not None else "-"
                            for k in ("efficiency", "efficiency_vs_share", "busy"))
        print(f"{r['mode']:9} {r['gpus']:>4} {r['wall_s']:>7} {r['first_row_s']!s:>9} {r['rows']:>5} "
              f"{r['duplicates']:>4} {r['statuses'].get('ok', 0):>4} {eff:>5} {share:>6} {busy:>5} "
              f"{span:>18} {r.get('same_winner', '-')!s:>6}/{len(ratios)}")


if __name__ == "__main__":
    main()
