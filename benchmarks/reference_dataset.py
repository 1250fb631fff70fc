"""Reference dataset for strategy replay: exhaustive sweeps of a few points, in priority order, to a budget.

Each job is (model, tp, kernel, tokens or routes[, slice]). Without a slice a point
is swept exhaustively over its full constrained space (strategy tag "exhaustive").
With a slice (``KEY=v1|v2;...``) only candidates whose listed parameters take the
listed values are swept, exhaustively (tag "exhaustive-slice"): a full sub-grid, so
one-step neighbourhoods stay intact for replay, unlike a random sample (a key the
op does not have, such as A_LAYOUT for fp4_prefill.down, is ignored). At the budget
the sweep stops cleanly; rerunning resumes (measured candidates are skipped).
``points.json`` says, per point, how many candidates the (sliced) space has and how
many were measured, so partial points are never passed off as complete.

``--preset issue7`` is issue 7's points: fp8_decode gate_up and down, DeepSeek-V3 TP=8,
1/16/64 tokens, on the reference subspace FP8_SLICE; fp4_prefill gate_up and down,
DeepSeek-V4-Flash TP=2, 1536/6144/24576 routes, on FP4_SLICE. ``--preset issue7-third``
is the third model, Qwen3-30B-A3B TP=1, fp8 on FP8_SLICE. The full spaces are 1.4k-14k
(fp8) and ~22k (fp4) candidates a point: hours each.

    PYTHONPATH=. python benchmarks/reference_dataset.py --db data/reference/reference.sqlite \\
        --preset issue7 --budget-s 520 [--gpus all]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from moetune.problem import canonical_json
from moetune.tuner.factory import make_runner
from moetune.tuner.parallel import ParallelSweep
from moetune.tuner.problems import build_plan
from moetune.tuner.store import Store
from moetune.tuner.strategies import STRATEGIES
from moetune.tuner.sweep import Sweep, full_config

# The fp4 reference subspace: the unpack and the two decodes the H200 tables picked with every tile shape
# and operand swap, a fixed group size and warp count, 1 or 3 stages; 192-319 candidates a point instead
# of ~22k.
FP4_SLICE = "UNPACK=halves;A_LAYOUT=indexed;DECODE=fp8|f16;num_stages=1|3;GROUP_SIZE_M=8;num_warps=4"
# The fp8 reference subspace: every algorithm, split, swap and stage count with the tile sizes and warp
# counts the H200 tables picked (BLOCK_SIZE_M 16, N 32-256, K 128/256, 4/8 warps) and the activation
# modes 0 and 2 (1 is 2's numerics re-quantized in every program); ~1.5k candidates a point for
# DeepSeek-V3's gate/up instead of 6-14k.
FP8_SLICE = ("A_FP8=0|2;BLOCK_SIZE_M=16;PREFETCH=0;num_warps=4|8;BLOCK_SIZE_K=128|256;"
             "BLOCK_SIZE_N=32|64|128|256")
PRESETS = {
    "issue7": [
        f"deepseek-v3:8:fp8_decode.gate_up:tokens=1,16,64:{FP8_SLICE}",
        f"deepseek-v3:8:fp8_decode.down:tokens=1,16,64:{FP8_SLICE}",
        f"deepseek-v4-flash:2:fp4_prefill.gate_up:routes=1536,6144,24576:{FP4_SLICE}",
        f"deepseek-v4-flash:2:fp4_prefill.down:routes=1536,6144,24576:{FP4_SLICE}",
    ],
    "issue7-third": [
        f"qwen3-30b-a3b:1:fp8_decode.gate_up:tokens=1,16,64:{FP8_SLICE}",
        f"qwen3-30b-a3b:1:fp8_decode.down:tokens=1,16,64:{FP8_SLICE}",
    ],
}


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


def in_slice(config: dict, sl: dict[str, list]) -> bool:
    return all(k not in config or config[k] in v for k, v in sl.items())


def slice_strategy(sl: dict[str, list], base: str = "exhaustive") -> str:
    """Register (for this process) strategy ``base`` confined to the slice; returns its name. A
    strategy that sizes its budget from the candidates (the default) then sizes it from the slice."""
    if not sl:
        return base

    class InSlice(STRATEGIES[base]):
        name = f"{base}-slice"

        def start(self, ctx):
            keep = [i for i, c in enumerate(ctx.candidates) if in_slice(c, sl)]
            ctx.candidates = [ctx.candidates[i] for i in keep]
            ctx.keys = None if ctx.keys is None else [ctx.keys[i] for i in keep]
            super().start(ctx)

    STRATEGIES[InSlice.name] = InSlice
    return InSlice.name


def remeasure(sw: Sweep, pt, k: int, t_end: float) -> int:
    """Time the ``k`` fastest and ``k`` random other ok configs once more (rows tagged "remeasure"):
    the measurement-to-measurement noise that replay's noise model is checked against."""
    rows = sw.store.frame(**sw._key(pt.problem))
    if (rows["strategy"] == "remeasure").any():  # done on an earlier run
        return 0
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


def entry_for(store: Store, device, problem, pt, job: dict, strategy: str) -> dict:
    """What points.json says about one point: its (sliced) space and how much of it the store holds."""
    space = [c for c in pt.candidates if in_slice(c, job["slice"])]
    done = store.measured_configs(problem.kernel, device.name, problem.shape_key, problem.tokens,
                                  problem.routes, problem.active_fraction, problem.routing)
    done = {canonical_json(full_config(pt.spec, json.loads(c))) for c in done}  # rows from before a new key
    measured = len({canonical_json(c) for c in space} & done)
    return {"point": problem.describe(), "kernel": problem.kernel, "tokens": problem.tokens,
            "routes": problem.routes, "slice": job["slice"], "space": len(space), "pruned": pt.pruned,
            "strategy": strategy, "measured": measured, "complete": measured == len(space),
            "best_ms": pt.best.time_ms if pt.best else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--job", action="append", default=[])
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named list of jobs (before any --job)")
    ap.add_argument("--budget-s", "--deadline", dest="budget_s", type=float, default=280.0,
                    help="seconds from start; then stop cleanly (rerun to resume)")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes (default: every core but one)")
    ap.add_argument("--gpus", default=None, help="'all' or indices: measure on several GPUs of this host")
    ap.add_argument("--remeasure", type=int, default=10, help="fastest (and as many random) ok configs "
                    "timed again per complete point (one GPU only)")
    ap.add_argument("--out", default=None, help="where points.json goes (default: next to --db)")
    ap.add_argument("--strategy", default="exhaustive", choices=sorted(STRATEGIES),
                    help="search within each slice (default exhaustive: the reference data itself)")
    args = ap.parse_args()
    t_end = time.monotonic() + args.budget_s
    jobs = [parse_job(j) for j in PRESETS.get(args.preset, []) + args.job]
    if not jobs:
        ap.error("give --preset or at least one --job")
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    store = Store(args.db)
    runner, driver = make_runner(gpus=args.gpus, timeout=30.0, jobs=args.jobs)
    report: list[dict] = []
    try:
        device = runner.start()
        planned = []  # (job, strategy, problem, point)
        for job in jobs:
            try:
                plan = build_plan([job["kernel"]], model=job["model"], tp=job["tp"],
                                  tokens=job.get("tokens", []), routes=job.get("routes", []),
                                  active=[1.0] if "tokens" in job else [], device=device)
            except ValueError as e:
                report.append({"job": job, "error": str(e)})
                print(f"skipped {job}: {e}", flush=True)
                continue
            strategy = slice_strategy(job["slice"], args.strategy)
            for problem in plan.problems:
                planned.append((job, strategy, problem))
        if driver is ParallelSweep:  # every point of a slice at once, spread over the GPUs
            groups: dict[str, list] = {}
            for job, strategy, problem in planned:
                groups.setdefault(canonical_json(job["slice"]), []).append((job, strategy, problem))
            for group in groups.values():
                left = t_end - time.monotonic()
                if left <= 0:
                    break
                strategy = slice_strategy(group[0][0]["slice"], args.strategy)
                sw = driver(store, runner, strategy=strategy, seed=0, time_limit=left)
                t0 = time.monotonic()
                points = sw.run([p for _, _, p in group])
                for (job, strategy, problem), pt in zip(group, points, strict=True):
                    e = entry_for(store, device, problem, pt, job, strategy)
                    e["seconds"] = round(time.monotonic() - t0, 1)
                    report.append(e)
                    print(f"{e['point']}: {e['measured']}/{e['space']}, best {e['best_ms']}", flush=True)
        else:
            for job, strategy, problem in planned:
                job_end = min(t_end, time.monotonic() + job["cap"])
                left = job_end - time.monotonic()
                sw = Sweep(store, runner, strategy=slice_strategy(job["slice"], args.strategy), seed=0,
                           time_limit=max(left, 1e-3))
                t0 = time.monotonic()
                pt = sw.plan([problem], device)[0]
                if left > 0:
                    sw.run()
                e = entry_for(store, device, problem, pt, job, strategy)
                e["seconds"] = round(time.monotonic() - t0, 1)
                if left > 0 and e["complete"] and not sw.timed_out and args.remeasure:
                    e["remeasured"] = remeasure(sw, pt, args.remeasure, job_end)
                report.append(e)
                print(f"{e['point']}: {e['measured']}/{e['space']} in {e['seconds']} s, best {e['best_ms']}",
                      flush=True)
    finally:
        runner.close()
        store.close()
        out = Path(args.out) if args.out else Path(args.db).with_name("points.json")
        out.write_text(json.dumps(report, indent=1))
    print(f"{'point':80s} {'measured':>9s} {'space':>6s} {'s':>6s}")
    for e in report:
        if "point" in e:
            print(f"{e['point'][:80]:80s} {e['measured']:9d} {e['space']:6d} {e.get('seconds', 0):6}")


if __name__ == "__main__":
    main()
