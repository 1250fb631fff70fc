"""The warp-specialized FP4 kernel's design switches at dense points: the tables' pick timed as it is and
with PINGPONG (each MMA warpgroup a partition of its own, taking turns at the tensor cores) and RMAX_AHEAD
(each next tile's row maxima gathered a chunk at a time), each checked against the reference first.
``pingpong, free`` is PINGPONG without the turns (``fp4_ws_stages.launched``: the kernel with two lines
replaced), to see whether the ordering is what gains.

Times: ``triton.testing.do_bench`` (L2 cleared between runs), median ms, through the spec's own launch, as
the tuner times a candidate. Writes ws_designs.json under --out.

    PYTHONPATH=. python benchmarks/fp4_ws_designs.py --out $OUT/designs \\
        --point deepseek-v4-flash:2:fp4_prefill.gate_up:24576
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import triton
from fp4_ws_stages import launched

from moetune.models import get_model
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config

_FREE = [("mbarrier.wait(turn.index(H), (c - 1 + H) & 1, pred=c + H > 0)", "pass"),
         ("mbarrier.arrive(turn.index(1 - H), count=1)", "pass")]
VARIANTS: dict[str, tuple[dict, list]] = {
    "pick": ({}, []),
    "rmax ahead": ({"RMAX_AHEAD": 1}, []),
    "pingpong": ({"PINGPONG": 1}, []),
    "pingpong, rmax ahead": ({"PINGPONG": 1, "RMAX_AHEAD": 1}, []),
    "pingpong, free": ({"PINGPONG": 1}, _FREE),
    "pingpong, 3 stages": ({"PINGPONG": 1, "num_stages": 3}, []),
}


def measure(point: str, folder: Path, names: list[str]) -> list[dict]:
    model, tp, kernel, routes = point.split(":")
    spec = get_spec(kernel)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(model), int(tp)))
    problem = spec.problem(shape, -(-int(routes) // shape["top_k"]))
    pick = {**spec.default, **pick_config(kernel, shape, problem.routes, device="NVIDIA H200")}
    if not pick["DECODE_WARPS"]:
        print(f"{point}: the tables pick {pick}, not the warp-specialized kernel; skipped", flush=True)
        return []
    inputs = spec.make_inputs(problem, "cuda", 0)
    expected = spec.reference(inputs)
    rows = []
    for name in names:
        overrides, lines = VARIANTS[name]
        config = {**pick, **overrides}
        try:
            with launched(lines, folder):
                spec.run(inputs, config)
                spec.collect(inputs, config)
                err = spec.error(inputs.outputs, expected)
                ms = triton.testing.do_bench(lambda config=config: spec.run(inputs, config), warmup=50,
                                             rep=300, return_mode="median")
        except Exception as e:  # a variant the point cannot run (shared memory): said, not fatal
            print(f"{point} | {name} | {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        rows.append({"point": point, "variant": name, "ms": ms, "error": err, "ok": err <= spec.tolerance,
                     "tflops": spec.flops(problem) / ms / 1e9, "config": config})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--point", action="append", required=True, help="model:tp:kernel:routes")
    ap.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: all")
    args = ap.parse_args()
    names = ["pick", *[v for v in args.variant or VARIANTS if v != "pick"]]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in args.point:
            rows += measure(point, Path(tmp), names)
            (args.out / "ws_designs.json").write_text(json.dumps(rows, indent=1))
    print("| point | variant | ms | x pick | TFLOP/s | error |\n|---|---|---:|---:|---:|---:|")
    base = {r["point"]: r["ms"] for r in rows if r["variant"] == "pick"}
    for r in rows:
        flag = "" if r["ok"] else " FAILED"
        print(f"| {r['point']} | {r['variant']} | {r['ms']:.4f} | {r['ms'] / base[r['point']]:.3f} "
              f"| {r['tflops']:.0f} | {r['error']:.2g}{flag} |")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
