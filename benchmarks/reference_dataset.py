"""Reference dataset for strategy replay: exhaustive sweeps of a few points, in priority order, to a deadline.

Each job is (model, tp, kernel, tokens or routes[, slice]). Without a slice a point
is swept exhaustively over its full constrained space (strategy tag "exhaustive").
With a slice (``KEY=v1|v2;...``) only candidates whose listed parameters take the
listed values are swept, exhaustively (tag "exhaustive-slice"): a full sub-grid, so
one-step neighbourhoods stay intact for replay, unlike a random sample. At the
deadline the sweep stops cleanly; ``points.json`` says, per point, how many
candidates the (sliced) space has and how many were measured, so partial points
are never passed off as complete.

    PYTHONPATH=. python benchmarks/reference_dataset.py --db $OUT/reference.sqlite --deadline 280 \\
        --job "deepseek-v3:8:fp8_decode.gate_up:tokens=1,16"
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from moetune.problems import build_plan
from moetune.runner import Runner
from moetune.spec import canonical_json
from moetune.store import Store
from moetune.strategies import STRATEGIES
from moetune.strategies.exhaustive import Exhaustive
from moetune.sweep import Sweep


class Deadline(Exception):
    pass


def parse_job(text: str) -> dict:
    """"model:tp:kernel:tokens=1,16[:KEY=v|v;KEY=v][@seconds]" -> a job (seconds: its own time cap)."""
    text, _, cap = text.partition("@")
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise ValueError(f"--job {text!r}: expected model:tp:kernel:tokens=..|routes=..[:slice]")
    model, tp, kernel, density = parts[:4]
    kind, _, values = density.partition("=")
    if kind not in ("tokens", "routes"):
        raise ValueError(f"--job {text!r}: density must be tokens=... or routes=...")
    sl: dict[str, list] = {}
    if len(parts) == 5:
        for item in parts[4].split(";"):
            key, _, vals = item.partition("=")
            sl[key] = [json.loads(v) if v[:1].isdigit() else v for v in vals.split("|")]
    return {"model": model, "tp": int(tp), "kernel": kernel, kind: [int(v) for v in values.split(",")],
            "slice": sl, "cap": float(cap) if cap else float("inf")}


def slice_strategy(sl: dict[str, list]) -> str:
    """Register (for this process) an exhaustive strategy over the slice; returns its name."""
    if not sl:
        return "exhaustive"

    class ExhaustiveSlice(Exhaustive):
        name = "exhaustive-slice"

        def start(self, ctx):
            ctx.candidates = [c for c in ctx.candidates if all(c.get(k) in v for k, v in sl.items())]
            super().start(ctx)

    STRATEGIES[ExhaustiveSlice.name] = ExhaustiveSlice
    return ExhaustiveSlice.name


def remeasure(sw: Sweep, pt, k: int, t_end: float) -> int:
    """Time the ``k`` fastest and ``k`` random other ok configs once more (rows tagged "remeasure"):
    the measurement-to-measurement noise that replay's noise model is checked against."""
    rows = sw.store.frame(**sw._key(pt.problem))
    ok = rows[rows["status"] == "ok"].sort_values("time_ms")
    rest = ok.iloc[k:]
    pick = list(ok["config"].iloc[:k]) + list(rest["config"].sample(min(k, len(rest)), random_state=0))
    configs = [json.loads(c) for c in pick]
    n = 0
    for config, res in sw.runner.measure(pt.spec, pt.problem, configs, seed=1):
        row = sw._row(pt, config, res)
        row["strategy"] = "remeasure"
        sw.store.add(row)
        n += 1
        if time.monotonic() > t_end:
            break
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--job", action="append", required=True)
    ap.add_argument("--deadline", type=float, default=280.0, help="seconds from start; then stop cleanly")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (default: every core)")
    ap.add_argument("--remeasure", type=int, default=10, help="fastest (and as many random) ok configs "
                    "timed again per complete point")
    ap.add_argument("--out", default=None, help="where points.json goes (default: next to --db)")
    args = ap.parse_args()
    t_end = time.monotonic() + args.deadline
    jobs = [parse_job(j) for j in args.job]
    store = Store(args.db)
    runner = Runner(timeout=30.0, jobs=args.jobs)
    report, stopped = [], False
    try:
        runner.start()
        for job in jobs:
            try:
                plan = build_plan([job["kernel"]], model=job["model"], tp=job["tp"],
                                  tokens=job.get("tokens", []), routes=job.get("routes", []),
                                  active=[1.0] if "tokens" in job else [], device=runner.device)
            except ValueError as e:
                report.append({"job": job, "error": str(e)})
                print(f"skipped {job}: {e}", flush=True)
                continue
            strategy = slice_strategy(job["slice"])
            job_end = min(t_end, time.monotonic() + job["cap"])
            for problem in plan.problems:
                sw = Sweep(store, runner, strategy=strategy, seed=0)
                pt = sw.plan([problem], runner.device)[0]
                space = [c for c in pt.candidates if all(c.get(k) in v for k, v in job["slice"].items())]
                entry = {"point": problem.describe(), "kernel": problem.kernel, "tokens": problem.tokens,
                         "routes": problem.routes, "slice": job["slice"], "space": len(space),
                         "pruned": pt.pruned, "strategy": strategy}
                report.append(entry)
                if stopped or time.monotonic() > job_end:
                    entry["measured"] = 0
                    continue
                t0 = time.monotonic()

                def on_event(kind, end=job_end, **data):
                    if kind == "result" and time.monotonic() > end:
                        raise Deadline

                sw.on_event = on_event
                cut = False
                try:
                    sw.run()
                except Deadline:
                    cut = True
                    stopped = time.monotonic() > t_end
                keys = {canonical_json(c) for c in space}
                done = store.measured_configs(problem.kernel, runner.device.name, problem.shape_key,
                                              problem.tokens, problem.routes, problem.active_fraction,
                                              problem.routing)
                entry["measured"] = len(keys & done)
                entry["complete"] = entry["measured"] == len(space)
                entry["seconds"] = round(time.monotonic() - t0, 1)
                best = pt.best
                entry["best_ms"] = best.time_ms if best else None
                if not cut and args.remeasure:
                    entry["remeasured"] = remeasure(sw, pt, args.remeasure, job_end)
                print(f"{entry['point']}: {entry['measured']}/{entry['space']} in {entry['seconds']} s, "
                      f"best {entry['best_ms']}", flush=True)
    finally:
        runner.close()
        store.close()
        out = Path(args.out) if args.out else Path(args.db).with_name("points.json")
        out.write_text(json.dumps(report, indent=1))
    print(f"{'point':80s} {'measured':>9s} {'space':>6s} {'s':>6s}")
    for e in report:
        if "point" in e:
            print(f"{e['point'][:80]:80s} {e.get('measured', 0):9d} {e['space']:6d} {e.get('seconds', 0):6}")


if __name__ == "__main__":
    main()
