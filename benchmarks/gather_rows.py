"""GPU benchmark: one-launch gather of quantized rows + scales against two gathers and torch indexing.

Every timed op is captured N times in one CUDA graph; a replay is timed with CUDA events and the
median per-op time over the replays is reported (launch gaps included, as a serving step sees
them). Inputs of the small cases stay in L2; the 8192-row outputs (58.7 MB) exceed it. Every
fused config is checked byte-exact against torch indexing before it is timed.

    PYTHONPATH=. python benchmarks/gather_rows.py --out OUTDIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from moetune.device import device_info
from moetune.kernels.gather_rows.config import DEFAULT, group_count
from moetune.kernels.gather_rows.gather import gather_rows_with_scales, gather_rows_with_scales_reference
from moetune.routing import make_routes
from moetune.specs.base import Inputs
from moetune.specs.gather_rows import SPEC, sorted_dst2src

DEV = "cuda"
COPY_TBPS = 4.27  # H200 device-to-device copy, bytes read + written (DESIGN.md)
E, TOP_K = 256, 8
CASES = [(k, t) for k in (7168, 2048) for t in (1, 8, 64, 1024)]
PERM_CASE = (7168, 1024)  # 8192 rows, each from its own source row
# (BLOCK_SIZE_K, ROWS_PER_PROGRAM, num_warps): 4 to 64 bytes per thread, 32 to 256 threads.
CONFIGS = [
    (1024, 1, 4), (1024, 1, 8), (512, 1, 1), (1024, 1, 2), (2048, 1, 4), (4096, 1, 8), (256, 2, 1),
    (512, 2, 2), (1024, 2, 4), (256, 4, 2), (512, 4, 4), (1024, 1, 1), (2048, 1, 2), (4096, 1, 4),
    (8192, 1, 8), (1024, 2, 2), (2048, 2, 4), (1024, 4, 4), (2048, 4, 8), (2048, 1, 1), (4096, 1, 2),
    (8192, 1, 4), (4096, 2, 4), (2048, 4, 4),
]


def cfg(bk: int, rows: int, warps: int) -> dict:
    return {"BLOCK_SIZE_K": bk, "ROWS_PER_PROGRAM": rows, "num_warps": warps}


def graph_time_us(fn, inner: int, replays: int) -> float:
    """Median microseconds per call of ``fn`` captured ``inner`` times in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    for _ in range(3):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3 / inner


def copy_tbps() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    y = torch.empty_like(x)
    us = graph_time_us(lambda: y.copy_(x), inner=5, replays=10)
    return 2 * x.numel() / us / 1e6


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def make_case(k: int, tokens: int, perm: bool, gen: torch.Generator):
    if perm:  # every output row from a distinct source: no L2 reuse of the reads
        m = tokens * TOP_K
        idx = torch.randperm(m, generator=gen).to(torch.int32)
    else:
        m = tokens
        ids, _ = make_routes(tokens, TOP_K, E, generator=gen)
        idx = sorted_dst2src(ids)
    q = torch.randint(0, 256, (m, k), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scales = torch.rand(m, group_count(k), generator=gen) + 0.5
    return q.to(DEV), scales.to(DEV), idx.to(DEV)


def fused_ok(q, scales, idx, config) -> bool:
    out = (torch.empty(idx.numel(), q.shape[1], dtype=q.dtype, device=DEV),
           torch.empty(idx.numel(), scales.shape[1], dtype=torch.float32, device=DEV))
    for t in out:
        t.view(torch.uint8).fill_(0xA5)
    gather_rows_with_scales(q, scales, idx, config=config, out=out)
    ref = gather_rows_with_scales_reference(q, scales, idx)
    return all(same_bytes(a, b) for a, b in zip(out, ref, strict=True))


def edge_checks(gen: torch.Generator) -> list[str]:
    """Shapes the timed cases do not cover: tails, 7 groups, int64 maps, strided q, R in {0, 1}."""
    failures = []
    for k in (100, 896, 2048):
        base = torch.randint(0, 256, (37, k + 64), generator=gen, dtype=torch.uint8).to(DEV)
        q = base[:, 32:32 + k].view(torch.float8_e5m2)  # strided rows, unit inner stride
        scales = torch.randn(37, group_count(k), generator=gen).to(DEV)
        for rows in (0, 1, 301):
            for dtype in (torch.int32, torch.int64):
                idx = torch.randint(0, 37, (rows,), generator=gen).to(dtype).to(DEV)
                for c in (DEFAULT, cfg(128, 4, 1), cfg(4096, 2, 8)):
                    got = gather_rows_with_scales(q, scales, idx, config=c, validate=True)
                    ref = gather_rows_with_scales_reference(q, scales, idx)
                    if not all(same_bytes(a, b) for a, b in zip(got, ref, strict=True)):
                        failures.append(f"k={k} rows={rows} {dtype} {c}")
    return failures


def measure_case(k: int, tokens: int, perm: bool, gen: torch.Generator, deadline: float) -> dict:
    """Both baselines, the default and heuristic configs, then the sweep list until ``deadline``."""
    q, scales, idx = make_case(k, tokens, perm, gen)
    r, g = idx.numel(), scales.shape[1]
    qb, idx64 = q.view(torch.uint8), idx.long()
    inner, replays = (10, 20) if r >= 4096 else (50, 50)
    vo = torch.empty(r, k, dtype=torch.uint8, device=DEV)
    so = torch.empty(r, g, dtype=torch.float32, device=DEV)
    shape = {"E": E, "N": k, "K": k, "top_k": TOP_K}
    problem = SPEC.problem(shape, tokens)
    row = {"k": k, "tokens": tokens, "rows": r, "perm": perm,
           "floor_bytes": SPEC.bytes_moved(problem, Inputs({"dst2src": idx}, ())),
           "logical_bytes": 2 * r * (k + 4 * g) + 4 * r,
           "two_launch_us": graph_time_us(lambda: (torch.index_select(qb, 0, idx64, out=vo),
                                                   torch.index_select(scales, 0, idx64, out=so)),
                                          inner, replays),
           "torch_index_us": graph_time_us(lambda: (qb[idx64], scales[idx64]), inner, replays),
           "configs": {}}
    out = (torch.empty(r, k, dtype=q.dtype, device=DEV), so)
    heur = SPEC.heuristic(shape, r, device_info().arch)
    for c in [DEFAULT, heur] + [cfg(*c) for c in CONFIGS]:
        key = json.dumps(c, sort_keys=True)
        must = c in (DEFAULT, heur)
        if key in row["configs"] or not must and (time.time() > deadline
                                                  or SPEC.constraint(c, problem, device_info())):
            continue
        try:
            if not fused_ok(q, scales, idx, c):
                row["configs"][key] = {"error": "mismatch"}
                continue
            row["configs"][key] = {"us": graph_time_us(
                lambda c=c: gather_rows_with_scales(q, scales, idx, config=c, out=out), inner, replays)}
        except Exception as e:  # a config that fails to compile or launch is reported, not fatal
            row["configs"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
    timed = {key: v["us"] for key, v in row["configs"].items() if "us" in v}
    row["default_us"] = timed.get(json.dumps(DEFAULT, sort_keys=True), float("nan"))
    row["heuristic"], row["heuristic_us"] = heur, timed.get(json.dumps(heur, sort_keys=True), float("nan"))
    row["best"] = min(timed, key=timed.get)
    row["best_us"] = timed[row["best"]]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=90.0, help="stop the config sweep after this")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = device_info()
    env = {"device": dev.name, "arch": dev.arch, "torch": torch.__version__,
           "triton": __import__("triton").__version__}
    gen = torch.Generator().manual_seed(0)
    failures = edge_checks(gen)
    env["edge_check_failures"] = failures
    env["copy_tbps_measured"] = round(copy_tbps(), 3)
    print(json.dumps(env), flush=True)

    cases = [(k, t, False) for k, t in CASES] + [(*PERM_CASE, True)]
    rows_out = []
    for k, tokens, perm in cases:
        rows_out.append(measure_case(k, tokens, perm, gen, deadline=t0 + args.budget_s))
        print(f"k={k} tokens={tokens} perm={perm} done at {time.time() - t0:.0f}s", flush=True)
        (args.out / "gather_rows.json").write_text(json.dumps({"env": env, "rows": rows_out}, indent=1))

    lines = ["| k | tokens | rows | 2x index_select us | torch index us | fused default us | "
             "fused heuristic us | fused best us (BK,RPP,warps) | speedup vs 2 launches (default/best) | "
             "best TB/s floor bytes (% of 4.27) | best TB/s logical bytes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows_out:
        b = json.loads(row["best"])
        tag = f"{row['tokens']}" + (" (perm, M=8192)" if row["perm"] else "")
        floor = row["floor_bytes"] / row["best_us"] / 1e6
        logical = row["logical_bytes"] / row["best_us"] / 1e6
        two = row["two_launch_us"]
        lines.append(
            f"| {row['k']} | {tag} | {row['rows']} | {two:.2f} | {row['torch_index_us']:.2f} "
            f"| {row['default_us']:.2f} | {row['heuristic_us']:.2f} | {row['best_us']:.2f} "
            f"({b['BLOCK_SIZE_K']},{b['ROWS_PER_PROGRAM']},{b['num_warps']}) "
            f"| {two / row['default_us']:.2f}x / {two / row['best_us']:.2f}x "
            f"| {floor:.2f} ({100 * floor / COPY_TBPS:.0f}%) | {logical:.2f} |")
    table = "\n".join(lines)
    (args.out / "gather_rows.md").write_text(table + "\n")
    print(f"edge-case failures: {failures or 'none'}; measured copy {env['copy_tbps_measured']} TB/s; "
          f"total {time.time() - t0:.0f}s")
    print(table)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
