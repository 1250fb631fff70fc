"""One op's launches at one point, for a profiler to capture: the config the tables pick (or ``--config``),
checked against the reference, then ``--launches`` plain launches on rotated input sets (so the captured
one finds no weights in L2). Meant to run under Nsight Compute, e.g. the last launch of the gate/up GEMM:

    ncu --clock-control none --set full --launch-skip 4 --launch-count 1 -k regex:gemm -o $OUT/p \\
        python benchmarks/profile_gemm.py -m deepseek-v3 --tp 8 -k fp8_decode.gate_up --tokens 1

``--routes`` instead of ``--tokens`` for the prefill ops. Prints the config, the error and the launches'
median wall time (synchronized, so a launch's overhead included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from moetune.models import get_model
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("-k", "--kernel", required=True, help="one op, e.g. fp4_prefill.gate_up")
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--routes", type=int, help="routes (prefill): tokens = routes / top_k")
    ap.add_argument("--config", help="JSON config instead of the tables' pick")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--sets", type=int, default=4, help="input sets rotated between launches")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (TRITON_INTERPRET=1, small model)")
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(args.model), args.tp))
    if (args.tokens is None) == (args.routes is None):
        raise SystemExit("give --tokens or --routes")
    tokens = args.tokens if args.tokens is not None else -(-args.routes // shape["top_k"])
    problem = spec.problem(shape, tokens)
    config = json.loads(args.config) if args.config else pick_config(args.kernel, shape, problem.routes)
    config = {**spec.default, **config}
    weights = spec.make_weights(problem, args.device, 0)
    sets = [spec.make_inputs(problem, args.device, s, weights=weights if s == 0 else None)
            for s in range(args.sets)]
    spec.run(sets[0], config)
    spec.collect(sets[0], config)
    err = spec.error(sets[0].outputs, spec.reference(sets[0]))
    times = []
    for i in range(args.launches):
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        spec.run(sets[i % len(sets)], config)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"kernel": args.kernel, "shape": shape, "routes": problem.routes, "config": config,
                      "error": err, "passes": spec.passes(err), "median_ms": statistics.median(times)}))


if __name__ == "__main__":
    main()
