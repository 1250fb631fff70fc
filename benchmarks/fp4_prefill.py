"""H200 benchmark of the FP4 grouped prefill GEMMs (DeepSeek-V4-Flash, TP=2): the shipped static config,
the earlier best designs and the newer ones (f16x2 PTX unpack, even/odd halves, weights-left MMA), each
checked against the reference before its time counts, all within one ``--budget``.

    PYTHONPATH=. python benchmarks/fp4_prefill.py --out OUT_DIR --budget 240
        [--routes 1536,6144,24576] [--sample 8] [--configs FILE.json]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/fp4_prefill.py --out OUT_DIR --smoke   # CPU, tiny

Phase 1 compiles and smoke-runs every config in parallel worker processes (crash isolation, shared
Triton cache), stopping at ``--compile-share`` of the budget; phase 2 checks accuracy and times, one
config at a time, each problem getting its share of what is left. Output: ``measurements.jsonl``
(every row), ``compile_status.json``, ``worker_stderr.txt``, ``designs.md`` (best per design and
point), ``table.md`` and ``best.json``; the short table is printed last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from moetune.kernels.fp4_prefill.config import SPACE, normalize_config
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec

COPY_BW = 4.27e12  # bytes/s, measured device-to-device copy on this H200
BF16_RATE = 790e12  # flop/s, measured bf16 matmul
FP8_RATE = 1265e12  # flop/s, measured fp8 _scaled_mm
OPS = ("gate_up", "down")
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
# --smoke: odd tiny shapes (N tails, K tails of 32) the CPU interpreter gets through in a minute.
SMOKE_SHAPES = {"gate_up": {"E": 4, "N": 96, "K": 160, "top_k": 2},
                "down": {"E": 4, "N": 160, "K": 96, "top_k": 2}}


def _c(bm, bn, w, decode, unpack, st=1, swap=0, bk=128, g=8, **kw):
    return dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=st,
                DECODE=decode, UNPACK=unpack, SWAP_AB=swap, **kw)


def design(cfg: dict) -> str:
    """The design a config belongs to: decode/unpack, plus the operand order and the A layout."""
    cfg = dict(cfg)
    out = f"{cfg.get('DECODE', 'bf16')}/{cfg.get('UNPACK', 'join')}"
    if cfg.get("SWAP_AB"):
        out += "/swap"
    if cfg.get("A_LAYOUT") == "gathered":
        out += "/gathered"
    return out


def is_new(cfg: dict) -> bool:
    return cfg.get("UNPACK") in ("asm16", "halves") or bool(cfg.get("SWAP_AB"))


def fixed_configs(op: str) -> list[dict]:
    """Promising configs in priority order (timed first): the earlier winners, then the newer designs."""
    out = [  # the sm_90 heuristic's configs and the tuner's random-sweep best
        _c(16, 64 if op == "gate_up" else 128, 4, "fp8", "join"), _c(16, 128, 4, "fp8", "join", st=3),
        _c(64, 128, 8, "fp8", "join"), _c(128, 64, 8, "fp8", "join"),
        _c(32, 128, 4, "f16", "asm", st=2, g=16, **({"A_LAYOUT": "gathered"} if op == "gate_up" else {})),
        _c(32, 128, 4, "f16", "asm", st=2, g=16),
        _c(16, 128, 4, "f16", "asm"), _c(64, 128, 8, "fp8_row", "asm"), _c(128, 128, 8, "fp8_row", "asm"),
    ]
    for unpack, swaps in (("halves", (0, 1)), ("asm16", (0,))):  # new unpacks; small M tiles first
        for swap in swaps:
            for bm, bn, w, st in ((16, 128, 4, 1), (16, 128, 4, 2), (32, 128, 4, 2), (16, 64, 4, 1)):
                for dec in ("f16", "fp8_row", "fp8"):
                    out.append(_c(bm, bn, w, dec, unpack, st=st, swap=swap))
            for bm, bn, w, st in ((64, 128, 8, 1), (64, 128, 8, 2), (128, 128, 8, 1), (128, 64, 8, 1)):
                for dec in ("fp8_row", "fp8"):
                    out.append(_c(bm, bn, w, dec, unpack, st=st, swap=swap))
    return out


def random_configs(op: str, n: int, seed: int) -> list[dict]:
    """A small random sample of the new designs' space (the tuner's space, new switches only)."""
    rng = random.Random(seed + (op == "down"))
    out = []
    while len(out) < n:
        cfg = {k: rng.choice(v) for k, v in SPACE.items() if not (k == "A_LAYOUT" and op == "down")}
        cfg.update(UNPACK=rng.choice(("asm16", "halves")), BLOCK_SIZE_K=rng.choice((64, 128)),
                   DECODE=rng.choice(("f16", "fp8", "fp8_row", "bf16")))
        try:
            normalize_config(cfg, op)
        except ValueError:
            continue
        out.append(cfg)
    return out


def smoke_configs(op: str) -> list[dict]:
    """One config per design the interpreter can afford (the same code paths as the full list)."""
    return [_c(16, 64, 4, "fp8", "join", bk=64), _c(16, 64, 4, "f16", "asm16"),
            _c(32, 32, 4, "fp8_row", "halves", swap=1, bk=64), _c(16, 64, 4, "fp8", "halves", bk=64),
            _c(16, 64, 4, "bf16", "halves", swap=1, bk=64)]


def problems(args):
    preset = get_model(args.model)
    for op in OPS:
        spec = get_spec(f"fp4_prefill.{op}")
        shape = SMOKE_SHAPES[op] if args.smoke else spec.shape_from_model(preset, tp=args.tp)
        for routes in args.routes:
            yield op, spec, spec.problem(shape, tokens=max(1, routes // shape["top_k"]))


def _device():
    from moetune.device import device_info

    return device_info()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def worker(args) -> None:
    """Compile and run each config once per problem until the compile deadline; report which ran.

    Configs come in priority order, the two GEMMs alternating, so a deadline cuts both lists evenly;
    inputs are made once per problem and kept."""
    todo = json.loads(Path(args.worker).read_text())
    status, dev, inputs = {}, _device(), {}
    probs = list(problems(args))
    for op, cfg in todo:
        key = f"{op}|{canonical_json(cfg)}"
        for i, (o, spec, prob) in enumerate(probs):
            if o != op or status.get(key, "ok") != "ok" or spec.constraint(cfg, prob, dev):
                continue
            if time.time() > args.deadline:
                status.setdefault(key, "not compiled (budget)")
                break
            if i not in inputs:
                inputs[i] = spec.make_inputs(prob, DEVICE, seed=1)
            try:
                spec.run(inputs[i], cfg)
                sync()
                status[key] = "ok"
            except Exception as e:  # compile errors are results here
                msg = [ln for ln in str(e).splitlines() if ln.strip()]  # the cause is on the last lines
                status[key] = f"{type(e).__name__}: {' | '.join(msg[-3:])[:400]}"
        Path(args.worker + ".out").write_text(json.dumps(status))
    Path(args.worker + ".out").write_text(json.dumps(status))


def compile_all(configs: dict[str, list[dict]], args, deadline: float) -> dict[str, str]:
    """Round-robin the configs over ``--jobs`` workers in priority order, the GEMMs alternating."""
    tmp, jobs = Path(tempfile.mkdtemp(prefix="fp4_bench_")), args.jobs
    chunks = [[] for _ in range(jobs)]
    pairs = itertools.zip_longest(*(configs[op] for op in OPS))
    order = [(op, cfg) for pair in pairs for op, cfg in zip(OPS, pair, strict=True) if cfg is not None]
    for i, item in enumerate(order):
        chunks[i % jobs].append(item)
    procs = []
    for j, chunk in enumerate(chunks):
        f = tmp / f"worker{j}.json"
        f.write_text(json.dumps(chunk))
        cmd = [sys.executable, __file__, "--worker", str(f), "--routes", ",".join(map(str, args.routes)),
               "--model", args.model, "--tp", str(args.tp), "--deadline", str(deadline)]
        if args.smoke:
            cmd.append("--smoke")
        err = open(f"{f}.err", "w")
        procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err), f, chunk))
    status = {}
    for p, f, chunk in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time() + 10))
        except subprocess.TimeoutExpired:  # a compile stuck past the deadline: what it reported counts
            p.kill()
            p.wait()
        done = json.loads(Path(f"{f}.out").read_text()) if Path(f"{f}.out").exists() else {}
        status.update(done)
        if p.returncode:  # a crashed worker: whatever it had not reported counts as crashed
            for op, cfg in chunk:
                status.setdefault(f"{op}|{canonical_json(cfg)}", f"crash (worker rc {p.returncode})")
    errs = "".join(f"== {f}\n" + Path(f"{f}.err").read_text()[-3000:] for _, f, _ in procs)
    (args.out / "worker_stderr.txt").write_text(errs)
    (args.out / "compile_status.json").write_text(json.dumps(status, indent=0))
    return status


def time_ms(fn, reps: int = 30) -> tuple[float, float]:
    """Median and min over device events (wall clock, one run, on the CPU interpreter)."""
    if DEVICE != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3, (time.perf_counter() - t0) * 1e3
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    est = time.perf_counter() - t0
    reps = int(min(reps, max(3, 0.1 / max(est, 1e-6))))
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), min(times)


def measure(spec, prob, inputs, ref, configs, status, flops, floor_ms, deadline, log) -> list[dict]:
    """Accuracy first (outputs poisoned), then the time, for every config that compiled."""
    results, dev = [], _device()
    for cfg in configs:
        if spec.constraint(cfg, prob, dev):
            continue
        rec = {"op": spec.gemm, "routes": prob.routes, "design": design(cfg), "config": cfg}
        key = f"{spec.gemm}|{canonical_json(cfg)}"
        if time.time() > deadline:
            rec["status"] = "not timed (budget)"
        elif status.get(key) != "ok":
            rec["status"] = status.get(key, "not compiled")
        else:
            try:
                spec.poison(inputs)
                spec.run(inputs, cfg)
                spec.collect(inputs, cfg)
                rec["error"] = err = spec.error(inputs.outputs, ref)
                if not spec.passes(err):
                    rec["status"] = "inaccurate"
                else:
                    med, mn = time_ms(lambda c=cfg: spec.run(inputs, c))
                    rec.update(status="ok", ms=med, min_ms=mn, tflops=flops / med / 1e9,
                               x_floor=med / floor_ms)
                    results.append(rec)
            except Exception as e:  # recorded, the sweep goes on
                rec["status"] = f"crash: {type(e).__name__}: {str(e)[-300:]}"
        log.write(json.dumps(rec) + "\n")
        log.flush()
    if results:  # the best, timed again: the noise floor next to the number that counts
        best = min(results, key=lambda r: r["ms"])
        best["ms_again"] = time_ms(lambda: spec.run(inputs, best["config"]))[0]
    return results


def _dedupe(op: str, cfgs: list[dict]) -> list[dict]:
    seen, out = set(), []
    for c in cfgs:
        key = canonical_json(normalize_config(c, op))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _cfg_str(cfg: dict) -> str:
    c = dict(cfg)
    return (f"M{c['BLOCK_SIZE_M']} N{c['BLOCK_SIZE_N']} K{c['BLOCK_SIZE_K']} w{c['num_warps']} "
            f"s{c['num_stages']} G{c.get('GROUP_SIZE_M', 8)} {design(c)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench-out/fp4_prefill"))
    ap.add_argument("--routes", type=lambda s: [int(v) for v in s.split(",")], default=None)
    ap.add_argument("--configs", type=Path, help="JSON {op: [configs]} instead of the fixed list + sample")
    ap.add_argument("--sample", type=int, default=8, help="random configs of the new designs per GEMM")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=min(15, os.cpu_count() or 1))
    ap.add_argument("--budget", type=float, default=240, help="seconds of wall time for everything")
    ap.add_argument("--compile-share", type=float, default=0.4, help="part of the budget for phase 1")
    ap.add_argument("--smoke", action="store_true", help="tiny odd shapes, one config per design")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.routes is None:
        args.routes = [24, 96] if args.smoke else [1536, 6144, 24576]
    if args.worker:
        return worker(args)
    t_start = time.time()
    end = t_start + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    if args.configs:
        configs = json.loads(args.configs.read_text())
    elif args.smoke:
        configs = {op: smoke_configs(op) for op in OPS}
    else:
        configs = {op: fixed_configs(op) + random_configs(op, args.sample, args.seed) for op in OPS}
    dev = _device()
    for op in OPS:  # the static default and the picker's fallback at every point are always timed
        spec = get_spec(f"fp4_prefill.{op}")
        heur = [spec.heuristic(p.shape, p.routes, dev.arch) for o, _, p in problems(args) if o == op]
        configs[op] = _dedupe(op, [dict(spec.default), *heur, *configs[op]])
    t0 = time.time()
    status = compile_all(configs, args, t_start + args.compile_share * args.budget)
    print(f"compiled {len(status)} (op, config) pairs in {time.time() - t0:.0f}s; "
          f"{sum(v != 'ok' for v in status.values())} failed or skipped", flush=True)
    rows, per_design, log = [], {}, open(args.out / "measurements.jsonl", "w")
    todo = list(problems(args))
    for i, (op, spec, prob) in enumerate(todo):
        deadline = time.time() + (end - time.time()) / (len(todo) - i)  # this problem's share of what is left
        inputs = spec.make_inputs(prob, DEVICE, seed=7)
        ref = spec.reference(inputs)
        flops = spec.flops(prob, inputs)
        s = prob.shape
        floor_ms = s["E"] * s["N"] * (s["K"] // 2 + s["K"] // 32) / COPY_BW * 1e3
        results = measure(spec, prob, inputs, ref, configs[op], status, flops, floor_ms, deadline, log)
        static_key = canonical_json(normalize_config(spec.default, op))
        static = next((r for r in results
                       if canonical_json(normalize_config(r["config"], op)) == static_key), None)
        old = [r for r in results if not is_new(r["config"])]
        new = [r for r in results if is_new(r["config"])]
        best = min(results, key=lambda r: r["ms"]) if results else None
        rows.append(dict(op=op, routes=prob.routes, density=prob.density, floor=floor_ms, n=len(results),
                         static=static, old=min(old, key=lambda r: r["ms"]) if old else None,
                         new=min(new, key=lambda r: r["ms"]) if new else None, best=best))
        for r in results:
            k = (op, prob.routes, r["design"])
            if k not in per_design or r["ms"] < per_design[k]["ms"]:
                per_design[k] = r
        print(f"{op} routes={prob.routes}: {len(results)} timed; best {_ms(best)} ms "
              f"{best and _cfg_str(best['config'])}", flush=True)
        del inputs, ref
    log.close()
    _write_reports(args, rows, per_design, time.time() - t_start)


def _ms(r) -> str:
    return f"{r['ms']:.3f}" if r else "-"


def _write_reports(args, rows, per_design, wall) -> None:
    designs = sorted({d for (_, _, d) in per_design})
    points = [(r["op"], r["routes"]) for r in rows]
    lines = ["| design | " + " | ".join(f"{o} {rt}" for o, rt in points) + " |",
             "|---|" + "---|" * len(points)]
    for d in designs:
        cells = []
        for o, rt in points:
            r = per_design.get((o, rt, d))
            cells.append(f"{r['ms']:.3f} ({r['x_floor']:.1f}x)" if r else "-")
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    (args.out / "designs.md").write_text("Best ms per design (x of the memory floor)\n\n"
                                         + "\n".join(lines) + "\n")
    head = ["| GEMM | routes | rows/exp | static ms | old best ms | new best ms | best x floor | TFLOP/s "
            "| % bf16 | % fp8 | again ms | timed | best config |", "|" + "---|" * 13]
    for r in rows:
        b = r["best"]
        if not b:
            head.append(f"| {r['op']} | {r['routes']} | {r['density']:g} | | | | | | | | | 0 | |")
            continue
        tf, x = b["tflops"], b["ms"] / r["floor"]
        head.append(f"| {r['op']} | {r['routes']} | {r['density']:g} | {_ms(r['static'])} | {_ms(r['old'])} "
                    f"| {_ms(r['new'])} | {x:.2f}x | {tf:.0f} | {tf / BF16_RATE * 1e14:.0f}% "
                    f"| {tf / FP8_RATE * 1e14:.0f}% | {b['ms_again']:.3f} | {r['n']} "
                    f"| {_cfg_str(b['config'])} |")
    table = "\n".join(head)
    (args.out / "table.md").write_text(table + f"\n\nwall {wall:.0f}s\n")
    best = {f"{r['op']}|{r['routes']}": r["best"]["config"] for r in rows if r["best"]}
    (args.out / "best.json").write_text(json.dumps(best, indent=1))
    print("\n".join(lines))
    print()
    print(table)
    print(f"wall {wall:.0f}s (budget {args.budget:.0f}s)")


if __name__ == "__main__":
    main()
