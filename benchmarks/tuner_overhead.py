"""What the tuner costs on a GPU: per-candidate overhead by phase, sweep rate, compile rate, crash isolation.

Phases (``--phases``, each capped so the whole run fits ``--budget-s``):
  crash:   the test-only ``test.crashy`` spec (tests/crashy_spec.py), whose configs abort, segfault, hang,
           raise, return wrong results or make a real illegal memory access; the sweep must record each
           and go on (~35 s on the H200);
  compile: configs compiled per second with 1 process and with one per core, into empty caches (~45 s);
  fp8:     a sweep of fp8_decode.gate_up for DeepSeek-V3 TP=8 at 16 tokens, and
  fp4:     of fp4_prefill.gate_up for DeepSeek-V4-Flash TP=2 at 6144 routes: random order over the full
           constrained space (a uniform sample) until the phase's time cap, compiling the next batch while
           this one is measured. The whole exhaustive sweep's wall time is extrapolated from the measured
           rate and labelled as such. Each timed candidate's overhead (its wall time in the sweep minus the
           GPU time of its timed runs) is split into phases: inputs (fresh activations/routes, pooled
           weights; the first candidate also makes the pool), reference, check (poisoned run + error),
           timing (beyond the kernel's own time), store, and ipc (pipe and scheduling).

Usage: ``PYTHONPATH=. python benchmarks/tuner_overhead.py --out DIR [--budget-s 120] [--phases fp8,fp4]
[--smoke]`` (``--smoke``: CPU interpreter, tiny model). Writes DIR/tuner.sqlite and DIR/tuner_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def phase_crash(db: Path, model: str, timeout: float) -> dict:
    import crashy_spec  # noqa: F401  (registers test.crashy)

    from moetune.models import get_model
    from moetune.specs.registry import get_spec
    from moetune.tuner.backends.process import Runner
    from moetune.tuner.store import Store
    from moetune.tuner.sweep import Sweep

    spec = get_spec("test.crashy")
    problem = spec.problem(spec.shape_from_model(get_model(model)), 16)
    t0 = time.monotonic()
    with Store(db) as store, Runner(timeout=timeout, jobs=0) as runner:
        points = Sweep(store, runner, strategy="exhaustive").run([problem])
        rows = store.frame(kernel="test.crashy")
    modes = {}
    for r in rows.to_dict("records"):
        cfg = json.loads(r["config"])
        if cfg["v"] == 0:
            modes[cfg["mode"]] = {"status": r["status"], "reason": r["reason"]}
    return {"wall_s": time.monotonic() - t0, "rows": len(rows), "modes": modes,
            "ok_rows": int((rows["status"] == "ok").sum()), "pruned": points[0].pruned}


def compile_rate(runner, spec, problem, configs) -> dict:
    """Configs per second through ``runner``'s compile pool (started first, its start timed apart)."""
    t0 = time.monotonic()
    runner.compile(spec, problem, [spec.default])
    started = time.monotonic() - t0
    t0 = time.monotonic()
    res = runner.compile(spec, problem, configs)
    secs = time.monotonic() - t0
    ok = sum(r["status"] == "ok" for r in res.values())
    return {"jobs": runner.jobs, "configs": len(configs), "compiled_ok": ok, "seconds": secs,
            "configs_per_s": len(configs) / secs, "pool_start_s": started}


def phase_sweep(db: Path, runner, kernel: str, model: str, tp: int, limit: float, **density) -> dict:
    from moetune.tuner.problems import build_plan
    from moetune.tuner.store import Store
    from moetune.tuner.sweep import Sweep

    plan = build_plan([kernel], model=model, tp=tp, device=runner.device, **density)
    compile_before = runner.compile_seconds
    t0 = time.monotonic()
    with Store(db) as store:
        sw = Sweep(store, runner, strategy="random", seed=0, time_limit=limit)
        pt = sw.run(plan.problems)[0]
    wall = time.monotonic() - t0
    measured = sum(pt.counts.values())
    rejected = pt.counts["inaccurate"]
    failed = sum(pt.counts[s] for s in ("compile_error", "crash", "timeout", "invalid"))
    rate = measured / wall if wall else 0.0
    total = len(pt.candidates)
    phases = {}
    if sw.phases_ms:
        parts = ("setup", "inputs_host", "inputs_sync", "timing_sets")
        for p in sw.phases_ms:
            p["inputs"] = sum(p.get(n, 0.0) for n in parts)
        for name in ("inputs", *parts, "reference", "check", "timing", "store", "kernel"):
            phases[name] = statistics.median(p.get(name, 0.0) for p in sw.phases_ms)
        phases["timing"] -= phases["kernel"]  # timing overhead beyond the kernel's own runs
        phases["ipc"] = statistics.median(p["parent"] - p["worker"] for p in sw.phases_ms)
    return {
        "kernel": kernel, "point": pt.problem.describe(), "space": total + pt.pruned, "pruned": pt.pruned,
        "candidates": total, "measured": measured, "ok": pt.counts["ok"], "rejected_inaccurate": rejected,
        "failed": failed, "counts": dict(pt.counts), "wall_s": wall, "candidates_per_s": rate,
        "exhaustive_estimate_s": total / rate if rate else None, "timed_out": sw.timed_out,
        "overhead_ms_median": statistics.median(sw.overhead_ms) if sw.overhead_ms else None,
        "overhead_ms_p90": (statistics.quantiles(sw.overhead_ms, n=10)[8] if len(sw.overhead_ms) > 1
                            else None),
        "phases_ms_median": phases, "timed": len(sw.phases_ms),
        "compile_wait_s": runner.compile_seconds - compile_before,
        "best_ms": pt.best.time_ms if pt.best else None,
        "default_ms": pt.baseline.time_ms if pt.baseline and pt.baseline.ok else None,
        "best_config": pt.best.config if pt.best else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall-clock budget of the whole run")
    ap.add_argument("--phases", default="fp8,fp4", help="comma-separated: crash, compile, fp8, fp4")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny model, a few seconds a phase")
    args = ap.parse_args()
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not phases or phases - {"crash", "compile", "fp8", "fp4"}:
        ap.error(f"--phases: pick from crash, compile, fp8, fp4 (got {args.phases!r})")
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "tuner.sqlite"
    report: dict = {"phases": sorted(phases)}
    t_start = time.monotonic()

    def left() -> float:
        return args.budget_s - (time.monotonic() - t_start)

    def save() -> None:
        (args.out / "tuner_overhead.json").write_text(json.dumps(report, indent=2, default=str))

    from moetune.device import device_info
    from moetune.specs.registry import get_spec
    from moetune.tuner.backends.process import Runner
    from moetune.tuner.problems import build_plan
    from moetune.tuner.sweep import plan_points

    dev = device_info()
    report["device"] = dev.name
    cores = os.cpu_count() or 1
    big = "tiny" if args.smoke else None
    print(f"device {dev.name} ({dev.arch}), {cores} cores, budget {args.budget_s:.0f} s, "
          f"phases {','.join(sorted(phases))}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="moetune-bench-"))
    if "crash" in phases:
        os.environ["TRITON_CACHE_DIR"] = str(tmp / "crash")  # workers inherit the cache dir at spawn
        report["crash"] = phase_crash(db, "tiny", timeout=4.0 if args.smoke else 5.0)
        print("crash isolation:", json.dumps(report["crash"]["modes"]), flush=True)
        save()

    # Compile throughput on the fp8 decode GEMM's real shape, into empty caches; the configs come
    # from the end of the order the sweep below walks, so the sweep never finds them cached.
    spec = get_spec("fp8_decode.gate_up")
    plan = build_plan(["fp8_decode.gate_up"], model=big or "deepseek-v3", tp=1 if big else 8, tokens=[16],
                      active=[1.0], device=dev)
    point = plan_points(plan.problems, dev)[0]
    order = list(point.candidates)
    random.Random(f"0:{point.problem.describe()}").shuffle(order)  # RandomSearch's order, seed 0
    n1, nn = (3, 6) if args.smoke else (12, 8 * cores)
    report["compile"] = []
    if "compile" in phases:
        os.environ["TRITON_CACHE_DIR"] = str(tmp / "one")
        one = Runner(timeout=120, jobs=1)  # a compile pool only; no measuring worker is started
        try:
            report["compile"].append(compile_rate(one, spec, point.problem, order[-n1:]))
        finally:
            one.close()
        print("compile, 1 process:", report["compile"][-1], flush=True)

    os.environ["TRITON_CACHE_DIR"] = str(tmp / "sweep")
    with Runner(timeout=120.0 if args.smoke else 30.0) as runner:
        if "compile" in phases:
            report["compile"].append(compile_rate(runner, spec, point.problem, order[-n1 - nn:-n1]))
            print(f"compile, {runner.jobs} processes:", report["compile"][-1], flush=True)
            save()
        if "fp8" in phases:
            share = 2 if "fp4" in phases else 1
            fp8_cap = max(10.0, (left() - 15) / share)
            report["fp8_sweep"] = phase_sweep(db, runner, "fp8_decode.gate_up", big or "deepseek-v3",
                                              1 if big else 8, fp8_cap, tokens=[16], active=[1.0])
            print("fp8 sweep:", report["fp8_sweep"], flush=True)
            save()
        if "fp4" in phases:
            fp4_cap = max(10.0, left() - 10)
            routes = [32] if big else [6144]
            report["fp4_sweep"] = phase_sweep(db, runner, "fp4_prefill.gate_up", big or "deepseek-v4-flash",
                                              1 if big else 2, fp4_cap, routes=routes)
            print("fp4 sweep:", report["fp4_sweep"], flush=True)
    report["total_s"] = time.monotonic() - t_start
    save()

    print("\n| phase | result |\n|---|---|")
    if "crash" in report:
        c = report["crash"]
        print(f"| crash isolation | {c['rows']} rows in {c['wall_s']:.1f} s: "
              + ", ".join(f"{m}={v['status']}" for m, v in c["modes"].items()) + " |")
    for r in report["compile"]:
        print(f"| compile, {r['jobs']} process(es) | {r['configs_per_s']:.2f} configs/s "
              f"({r['configs']} in {r['seconds']:.1f} s; pool start {r['pool_start_s']:.1f} s) |")
    for key in ("fp8_sweep", "fp4_sweep"):
        if key not in report:
            continue
        r = report[key]
        est = r["exhaustive_estimate_s"]
        print(f"| {r['kernel']} | {r['measured']}/{r['candidates']} measured ({r['pruned']} pruned) in "
              f"{r['wall_s']:.0f} s = {r['candidates_per_s']:.2f}/s (GPU waited {r['compile_wait_s']:.0f} s "
              f"for compiles); ok {r['ok']}, rejected {r['rejected_inaccurate']}, failed {r['failed']}; "
              f"full space est. {(est or float('nan')) / 60:.1f} min |")
    print("\nper-candidate overhead, median ms (timing = beyond the kernel's own runs)")
    names = ("inputs", "reference", "check", "timing", "store", "ipc")
    parts = ("setup", "inputs_host", "inputs_sync", "timing_sets")
    print(f"| kernel | timed | {' | '.join(names)} | total | kernel |\n|---|---|" + "---|" * (len(names) + 2))
    for key in ("fp8_sweep", "fp4_sweep"):
        r = report.get(key)
        if r and r["phases_ms_median"]:
            ph = r["phases_ms_median"]
            print(f"| {r['kernel']} | {r['timed']} | " + " | ".join(f"{ph[n]:.1f}" for n in names)
                  + f" | {r['overhead_ms_median']:.1f} | {ph['kernel']:.1f} |")
    for key in ("fp8_sweep", "fp4_sweep"):
        r = report.get(key)
        if r and r["phases_ms_median"]:
            split = ", ".join(f"{n} {r['phases_ms_median'].get(n, 0.0):.1f}" for n in parts)
            print(f"inputs of {r['kernel']}, split (median ms): {split}")
    print(f"total {report['total_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
