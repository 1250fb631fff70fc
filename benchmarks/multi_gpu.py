"""Does spreading a sweep over workers change what it measures? One small problem, four ways.

1. ``moetune sweep --gpus all`` (the command itself; on a one-GPU host this is the plain sweep),
2. the plain sweep (library: ``Runner`` + ``Sweep``),
3. the parallel driver with one worker on GPU 0 (``LocalBackend([0])`` + ``ParallelSweep``),
4. two measuring workers sharing GPU 0 (``LocalBackend([0, 0])``): what two Ray actors with half a GPU each
   do, with the same worker processes and driver, without Ray.

Each writes its own store; the random strategy with one seed and budget picks the same candidates every
time, so every store must hold the same (config, status) set, each config once. Prints a table, writes
``multi_gpu.json`` under ``--out``. ``--smoke`` runs it on the tiny model through the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def summarize(name: str, db: Path, wall: float, plain: set | None) -> dict:
    from moetune.tuner.store import Store

    with Store(db) as s:
        rows = s.frame()
    keys = list(zip(rows["tokens"], rows["config"], rows["status"], strict=True))
    return {"run": name, "wall_s": round(wall, 1), "rows": len(rows), "unique": rows["config"].nunique(),
            "ok": int((rows["status"] == "ok").sum()),
            "same_as_plain": None if plain is None else set(keys) == plain,
            "best_ms": float(rows["time_ms"].min()) if len(rows) else None, "keys": sorted(keys)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kernel", default="fp8_decode.gate_up")
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--budget", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=100.0, help="skip runs that would start after this")
    ap.add_argument("--smoke", action="store_true", help="tiny model, interpreter")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        args.model, args.tp, args.tokens, args.budget = "tiny", 1, 1, 3
    from moetune.models import get_model
    from moetune.specs.registry import get_spec
    from moetune.tuner.backends.local import LocalBackend
    from moetune.tuner.backends.process import Runner
    from moetune.tuner.parallel import ParallelSweep
    from moetune.tuner.store import Store
    from moetune.tuner.sweep import Sweep

    args.out.mkdir(parents=True, exist_ok=True)
    spec = get_spec(args.kernel)
    problems = [spec.problem(spec.shape_from_model(get_model(args.model), args.tp), args.tokens)]
    opts = {"strategy": "random", "budget": args.budget, "seed": 0}
    t_start, results = time.monotonic(), []

    def library(name: str, runner, driver) -> None:
        db = args.out / f"{name.replace(' ', '_').replace(',', '')}.sqlite"
        t0 = time.monotonic()
        with Store(db) as store, runner:
            driver(store, runner, **opts).run(problems)
        results.append((name, db, time.monotonic() - t0))

    # 1: the command, as a user types it
    db = args.out / "gpus_all.sqlite"
    cmd = [sys.executable, "-c", "from moetune.cli import main; main()", "sweep", "--kernel", args.kernel,
           "--model", args.model, "--tp", str(args.tp), "--tokens", str(args.tokens), "--active", "1",
           "--strategy", "random", "--budget", str(args.budget), "--seed", "0", "--db", str(db),
           "--gpus", "all", "--quiet"]
    t0 = time.monotonic()
    cli = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    (args.out / "gpus_all.log").write_text(cli.stdout + cli.stderr)
    print(cli.stdout[-3000:] + cli.stderr[-2000:], flush=True)
    if cli.returncode == 0:
        results.append(("gpus_all (cli)", db, time.monotonic() - t0))
    runs = [("plain", lambda: Runner(), Sweep),
            ("pool 1 worker", lambda: LocalBackend([0]), ParallelSweep),
            ("pool 2 workers, 1 GPU", lambda: LocalBackend([0, 0]), ParallelSweep)]
    for name, make, driver in runs:
        if time.monotonic() - t_start > args.budget_s:
            print(f"skipped {name}: past --budget-s", flush=True)
            continue
        library(name, make(), driver)
        print(f"done {name}", flush=True)

    plain = next((r for r in results if r[0] == "plain"), None)
    ref = set(map(tuple, summarize(*plain, None)["keys"])) if plain else None
    table = [summarize(name, db, wall, ref) for name, db, wall in results]
    (args.out / "multi_gpu.json").write_text(json.dumps(
        {"cli_returncode": cli.returncode, "kernel": args.kernel, "model": args.model, "tp": args.tp,
         "tokens": args.tokens, "budget": args.budget, "runs": table}, indent=1, default=str))
    print(f"\n{args.kernel} {args.model} tp={args.tp} tokens={args.tokens}, random, budget {args.budget}")
    print(f"{'run':24} {'wall s':>7} {'rows':>5} {'unique':>6} {'ok':>4} {'same as plain':>13} "
          f"{'best ms':>9}")
    for r in table:
        best = "-" if r["best_ms"] is None else f"{r['best_ms']:.4g}"
        print(f"{r['run']:24} {r['wall_s']:>7} {r['rows']:>5} {r['unique']:>6} {r['ok']:>4} "
              f"{str(r['same_as_plain']):>13} {best:>9}")


if __name__ == "__main__":
    main()
