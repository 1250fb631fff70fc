"""H200: how much does the routing draw move one config's time, typical draws against plain ones?

Since session 13 every spec draws uniform routing "typical" (distinct active experts at their
expectation, ``make_routes(typical=True)``). Session 14's bench then read DeepSeek-V3 TP8 gate/up at
16 tokens 13% slower than session 13's, same config, while the heuristic's config moved 3%. This
times given configs (default: the picker's and the heuristic's) on ``--draws`` routing draws each way.
A draw's timing sets share its routing and activations and rotate four weight sets, so no run finds
its experts in L2 and every run of a draw reads the same expert bytes. A plain draw is a typical one
with ``routing.TYPICAL_TRIES`` = 1 (the first draw kept). Prints, per config and draw kind, the
distinct experts and M blocks of 16 the draws touched, the median time and its range over draws, and
the roofline fraction; writes every draw's row to ``draw_effect.json`` under --out.

    PYTHONPATH=. python benchmarks/draw_effect.py --out $OUT/d --kernel fp8_decode.gate_up --tokens 16
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

import moetune.routing as routing
from moetune.device import device_info
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config
from moetune.tuner.store import read_frame
from moetune.tuner.timing import TimingOptions, roofline_frac, time_graph


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernel", default="fp8_decode.gate_up")
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[16])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--config", action="append", default=[], help="a config as JSON (repeat); "
                    "default: the picker's and the heuristic's")
    ap.add_argument("--from-store", help="also time the --top fastest ok configs a store (.sqlite or "
                    ".sqlite.gz) holds for this kernel and model at each --tokens (re-timing another "
                    "run's winners on this card)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--kernel-only", action="store_true", help="as moetune bench --kernel-only")
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    shape = spec.shape_from_model(get_model(args.model), args.tp)
    dev = device_info()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    problem0 = spec.problem(shape, args.tokens[0])
    weights = [spec.make_weights(problem0, "cuda", 1000 + i) for i in range(4)]
    rows: list[dict] = []
    for tokens in args.tokens:
        problem = spec.problem(shape, tokens)
        configs = {f"cfg{i}": {**spec.default, **json.loads(c)} for i, c in enumerate(args.config)}
        if not configs:
            configs = {"table": pick_config(spec.name, shape, problem.routes, device=dev),
                       "heuristic": spec.heuristic(shape, problem.routes, dev.arch)}
        if args.from_store:
            stored = read_frame(args.from_store)
            here = ((stored["kernel"] == spec.name) & (stored["shape"] == canonical_json(shape))
                    & (stored.tokens == tokens) & (stored.status == "ok"))
            stored = stored[here].nsmallest(args.top, "time_ms")
            for rank, (cfg, ms) in enumerate(zip(stored.config, stored.time_ms, strict=True)):
                configs[f"store{rank + 1} ({ms * 1e3:.2f} us there)"] = {**spec.default, **json.loads(cfg)}
        for kind, tries in (("typical", 64), ("plain", 1)):
            routing.TYPICAL_TRIES = tries
            for draw in range(args.draws):
                sets = [spec.make_inputs(problem, "cuda", 7 * draw + 1, weights=w) for w in weights]
                ids = sets[0].tensors["topk_ids"]
                counts = torch.bincount(ids[ids >= 0].long().flatten(), minlength=shape["E"])
                experts = int((counts > 0).sum())
                blocks = int((-(-counts // 16)).sum())
                expected = spec.reference(sets[0])
                for s in sets:
                    s.extra["kernel_only"] = args.kernel_only
                for name, cfg in configs.items():
                    spec.poison(sets[0])
                    spec.run(sets[0], cfg)
                    spec.collect(sets[0], cfg)
                    err = float(spec.error(sets[0].outputs, expected))
                    if not spec.passes(err):
                        raise SystemExit(f"{name} {cfg}: error {err:.3g} at {tokens} tokens")
                    fns = [lambda s=s, c=cfg: spec.run(s, c) for s in sets]
                    samples, _ = time_graph(fns, TimingOptions())
                    ms = statistics.median(samples)
                    rows.append({"tokens": tokens, "kind": kind, "draw": draw, "config": name, "cfg": cfg,
                                 "experts": experts, "blocks16": blocks, "ms": ms,
                                 "roofline": roofline_frac(dev.name, spec.bytes_moved(problem, sets[0]),
                                                             spec.flops(problem, sets[0]), ms)})
                del sets
    routing.TYPICAL_TRIES = 64
    (out / "draw_effect.json").write_text(json.dumps(rows, indent=1))
    print("| tokens | config | draws | experts | M blocks | median us | min-max us | roofline |")
    print("|---:|---|---|---|---|---:|---|---:|")
    for tokens in args.tokens:
        for name in dict.fromkeys(r["config"] for r in rows if r["tokens"] == tokens):
            for kind in ("typical", "plain"):
                mine = [r for r in rows if (r["tokens"], r["config"], r["kind"]) == (tokens, name, kind)]
                us = [r["ms"] * 1e3 for r in mine]
                ex = [r["experts"] for r in mine]
                bl = [r["blocks16"] for r in mine]
                print(f"| {tokens} | {name} | {kind} | {min(ex)}-{max(ex)} | {min(bl)}-{max(bl)} | "
                      f"{statistics.median(us):.2f} | {min(us):.2f}-{max(us):.2f} | "
                      f"{statistics.median(r['roofline'] for r in mine):.1%} |")


if __name__ == "__main__":
    main()
