"""H200: how fast can one launch just read the bytes a decode GEMM must read (the 1-token target)?

The roofline of fp8 decode gate/up at 1 token (DeepSeek-V3 TP=8: 8 distinct experts' [512, 7168] fp8
weights and their scales, 29.5 MB) is bytes / copy bandwidth: 6.9 us. That bandwidth is a large copy's.
This times what a Triton kernel doing nothing but reading those bytes (each program XOR-folds a
contiguous span of one routed expert's weights, 16 bytes a thread per load) takes as one CUDA-graph
node, with the same timing as the tuner's (``moetune.tuner.timing.time_graph``: 10 runs a replay, input sets
rotated so no run finds its experts in L2), over programs per expert, bytes a program loads per step
(loads in flight), warps and programs per SM. Also an empty kernel (one program, no work): the fixed
cost of a node. Writes ``read_floor.json`` under --out and prints the table last.

    PYTHONPATH=. python benchmarks/read_floor.py --out $OUT/r
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl

from moetune.tuner.timing import TimingOptions, time_graph


@triton.jit
def _read_experts(w_ptr, ids_ptr, out_ptr, WORDS, SPAN, STEP: tl.constexpr):
    """Program (route, part) XOR-folds int32 words [part * SPAN, (part + 1) * SPAN) of expert ids[route]'s
    WORDS words, STEP words a step: the loads' results feed the output, so none is dropped."""
    r = tl.program_id(0)
    part = tl.program_id(1)
    e = tl.load(ids_ptr + r).to(tl.int64)
    base = w_ptr + e * WORDS
    acc = tl.zeros([STEP], tl.int32)
    start = part * SPAN
    for off in range(start, tl.minimum(start + SPAN, WORDS), STEP):
        acc ^= tl.load(base + off + tl.arange(0, STEP), mask=off + tl.arange(0, STEP) < WORDS, other=0)
    tl.store(out_ptr + r * tl.num_programs(1) + part, tl.xor_sum(acc, axis=0))


@triton.jit
def _empty(out_ptr):
    tl.store(out_ptr, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--n", type=int, default=512, help="weight rows (2 x intermediate for gate/up)")
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--routes", type=int, default=8, help="distinct experts read (1 token x top_k)")
    ap.add_argument("--sets", type=int, default=4, help="input sets rotated through the graph")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    words = args.n * args.k // 4
    w = torch.randint(-2**31, 2**31 - 1, (args.experts, words), dtype=torch.int32, device=dev)
    scale_bytes = args.n // 128 * -(-args.k // 128) * 4
    nbytes = args.routes * (words * 4 + scale_bytes)
    floor_us = nbytes / 4.27e12 * 1e6  # moetune.tuner.timing.CEILINGS["H200"] copy bandwidth
    g = torch.Generator().manual_seed(0)
    id_sets = [torch.randperm(args.experts, generator=g)[:args.routes].to(torch.int32).to(dev)
               for _ in range(args.sets)]
    opts = TimingOptions()
    rows = []

    def timed(name: str, fns) -> None:
        samples, _ = time_graph(fns, opts)
        us = statistics.median(samples) * 1e3
        rows.append({"variant": name, "us": us, "floor_frac": floor_us / us})
        print(json.dumps(rows[-1]), flush=True)

    sink = torch.empty(1, dtype=torch.int32, device=dev)
    timed("empty kernel (1 program)", [lambda: _empty[(1,)](sink)])
    for parts, step, warps in itertools.product((4, 8, 16, 33, 66), (512, 1024, 2048, 4096), (4, 8)):
        if step < warps * 32 * 4:  # under 16 bytes a thread
            continue
        span = -(-words // parts)
        span = -(-span // step) * step
        out = torch.empty(args.routes * parts, dtype=torch.int32, device=dev)
        launch = functools.partial(_read_experts[(args.routes, parts)], STEP=step, num_warps=warps)
        fns = [functools.partial(launch, w, ids, out, words, span) for ids in id_sets]
        timed(f"{args.routes * parts} programs, {step * 4 // 1024} KB a step, {warps} warps", fns)
    rows.sort(key=lambda r: r["us"])
    (out_dir / "read_floor.json").write_text(json.dumps({"bytes": nbytes, "floor_us": floor_us, "rows": rows},
                                                        indent=1))
    print(f"\n{nbytes / 1e6:.1f} MB of {args.routes} experts' weights and scales; copy-bandwidth floor "
          f"{floor_us:.2f} us\n")
    print("| read kernel | us | floor / us |\n|---|---:|---:|")
    for r in rows[:12] + [r for r in rows if r["variant"].startswith("empty")]:
        print(f"| {r['variant']} | {r['us']:.2f} | {r['floor_frac']:.1%} |")


if __name__ == "__main__":
    main()
