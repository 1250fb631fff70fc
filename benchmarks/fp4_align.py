"""FP4 prefill route alignment: the Triton launches (``align_routes``) against the torch reference.

For DeepSeek-V4-Flash (E 256, top_k 6) and gpt-oss-120b (E 128, top_k 4) at 768..49152 routes and
BLOCK_SIZE_M 16/64/128: checks all three outputs bit for bit, then times both as a CUDA graph of 20 calls
(median replay / 20, ms). Prints a short table last; full CSV to $OUT/fp4_align.csv when OUT is set.

    PYTHONPATH=. python benchmarks/fp4_align.py [--chunks 512 1024 2048]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from functools import partial

import torch

from moetune.kernels.fp4_prefill.align import CHUNK, align_routes
from moetune.kernels.fp4_prefill.reference import align_routes_reference
from moetune.routing import make_routes

MODELS = {"v4-flash": (256, 6), "gpt-oss": (128, 4)}
ROUTES = (768, 1536, 3072, 6144, 12288, 24576, 49152)
BLOCK_M = (16, 64, 128)
CALLS = 20


def graph_ms(fn, replays: int = 30) -> float:
    """Median time of one call, from replays of a CUDA graph of CALLS calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[CHUNK], help="routes per program")
    args = parser.parse_args()
    rows = []
    for model, (experts, top_k) in MODELS.items():
        for routes in ROUTES:
            g = torch.Generator(device="cuda").manual_seed(routes)
            ids, _ = make_routes(routes // top_k, top_k, experts, generator=g, device="cuda")
            for block_m in BLOCK_M:
                want = align_routes_reference(ids, experts, block_m)
                torch_ms = graph_ms(partial(align_routes_reference, ids, experts, block_m))
                for chunk in args.chunks:
                    got = align_routes(ids, experts, block_m, chunk=chunk)
                    same = all(torch.equal(getattr(got, n), getattr(want, n))
                               for n in ("sorted_ids", "expert_ids", "num_padded"))
                    run = partial(align_routes, ids, experts, block_m, chunk=chunk)
                    ms = graph_ms(run) if same else float("nan")
                    rows.append({"model": model, "experts": experts, "top_k": top_k, "routes": routes,
                                 "block_m": block_m, "chunk": chunk, "same_bytes": same,
                                 "triton_ms": round(ms, 4), "torch_ms": round(torch_ms, 4)})
                    print(rows[-1], flush=True)  # progress: the table below comes at the end
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "fp4_align.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    print(f"{'model':9} {'routes':>6} {'bm':>4} {'chunk':>5} {'same':>5} {'triton ms':>10} {'torch ms':>9}")
    for r in rows:
        print(f"{r['model']:9} {r['routes']:6} {r['block_m']:4} {r['chunk']:5} {str(r['same_bytes']):>5} "
              f"{r['triton_ms']:10.4f} {r['torch_ms']:9.4f}")
    if not all(r["same_bytes"] for r in rows):
        raise SystemExit("align_routes differs from the torch reference (rows with same False)")


if __name__ == "__main__":
    main()
