"""How a candidate is timed, and what its time is worth against the card's ceilings.

Launch-bound ops (``spec.cuda_graph``) are timed as CUDA-graph replays of several
runs, so launch overhead is what it will be in serving; every other op is timed
one run at a time between device events with L2 flushed before each run. Input
sets rotate when one set fits in L2, so no run reads what the previous one left
in cache. The reported time is the median of many samples after warm-up, with
the minimum and the spread (p80 - p20) / median. On the Triton interpreter the
same code runs with a wall clock; those times mean nothing and are marked so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Measured ceilings per card (device-name substring -> copy bytes/s (read + written), bf16 and fp8
# matrix flop/s). The H200 numbers are the team's own measurements (DESIGN.md).
CEILINGS: dict[str, tuple[float, float, float]] = {
    "H200": (4.27e12, 790e12, 1265e12),
}


@dataclass(frozen=True)
class TimingOptions:
    target_ms: float = 10.0  # device time spent on timed samples per candidate (before clamping)
    min_runs: int = 10
    max_runs: int = 100
    warmup: int = 2
    graph_runs: int = 10  # runs captured per CUDA graph; a sample is one replay / graph_runs
    wall_runs: int = 1  # interpreter: samples taken with the wall clock
    # A candidate whose first (estimating) samples are this many times the point's best so far keeps
    # them as its reading, and is not re-timed: it will not win, its accuracy is still checked, and
    # n_runs records its 3 samples. Most of a full space is this slow, and its timed runs would be most
    # of the sweep's device time (see docs/tuner.md, "Timing").
    slow_ratio: float = 1.5
    # A reading whose spread is above this is taken again (up to `retimes` more times) and the steadiest
    # kept. Few readings spread that wide; on the GPU a wide spread marks another process's work landing
    # in the timed window, and such readings are slow (see docs/tuner.md, "Timing").
    retime_spread: float = 0.05
    retimes: int = 2
    # GPU, CUDA-graph specs: before any graph is captured, one run is timed behind a spin kernel
    # (`time_probe`); over slow_ratio x the point's best so far, that run is the reading. Capturing
    # and replaying graphs cost most of a candidate's time, and most of a full space is far slower than
    # its best (see docs/tuner.md, "Timing"). The probe's
    # inputs are warm in L2 (graph replays rotate input sets that fit there), so it reads low if
    # anything: the safe side to err on.
    probe: bool = True
    probe_spin_cycles: int = 2_000_000  # ~1 ms on an H200: longer than the host takes to launch one run
    # Time the op's kernel alone (``moetune bench --kernel-only``): work a spec can make beforehand and
    # a layer shares or fuses elsewhere (the fp8 GEMMs' route alignment and activation split) is made
    # on the untimed first run; the worker marks the inputs (``inputs.extra["kernel_only"]``). For
    # figures quoted per kernel, as vLLM's fused_moe times are; sweeps time the whole op.
    kernel_only: bool = False


def summarize(samples_ms: Sequence[float]) -> dict[str, float | int]:
    """Median, min and relative spread (p80 - p20) / median of the samples."""
    xs = sorted(samples_ms)
    med = statistics.median(xs)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    spread = (q[7] - q[1]) / med if med > 0 else 0.0
    return {"time_ms": med, "min_ms": xs[0], "spread": spread, "n_runs": len(xs)}


def roofline_frac(device_name: str, nbytes: int | None, flops: int | None, time_ms: float | None,
                  mma: str = "bf16") -> float | None:
    """Fraction of the card's ceiling the time reaches: the larger of the memory term
    (bytes / copy bandwidth) and the compute term (flops / matrix rate, ``mma`` picks bf16 or fp8)
    over the time. None for cards without measured ceilings or without a time."""
    ceil = next((c for key, c in CEILINGS.items() if key in device_name), None)
    if ceil is None or not time_ms or time_ms <= 0:
        return None
    bandwidth, bf16, fp8 = ceil
    floor_s = max((nbytes or 0) / bandwidth, (flops or 0) / (fp8 if mma == "fp8" else bf16))
    return floor_s / (time_ms * 1e-3)


def _far_slower(run_ms: float, opts: TimingOptions, best_ms: float | None) -> bool:
    return bool(best_ms and opts.slow_ratio and run_ms > opts.slow_ratio * best_ms)


def _runs_for(est_ms: float, opts: TimingOptions, best_ms: float | None = None, per: int = 1) -> int:
    """Samples to take for a sample time of ``est_ms`` (``per`` runs each), ``best_ms`` the best run time
    at this point so far (None when there is none yet); 0: the estimating samples are the reading."""
    if _far_slower(est_ms / per, opts, best_ms):
        return 0
    n = int(opts.target_ms / max(est_ms, 1e-4))
    return max(opts.min_runs, min(opts.max_runs, n))


Samples = tuple[list[float], int]  # per-run times (ms) and how many runs each sample spans


def steadiest(take: Callable[[], Samples], opts: TimingOptions, best_ms: float | None = None
              ) -> tuple[dict[str, float | int], Samples, float, int]:
    """Take a reading, and again while its spread is above ``opts.retime_spread`` (at most
    ``opts.retimes`` more) unless it is far slower than ``best_ms``: (the steadiest reading's summary,
    its samples, the device time of all readings in ms, how many readings were taken)."""
    best: tuple[dict[str, float | int], Samples] | None = None
    spent, readings = 0.0, 0
    for _ in range(1 + max(0, opts.retimes)):
        readings += 1
        samples, per = take()
        spent += sum(samples) * per
        stats = summarize(samples)
        if best is None or stats["spread"] < best[0]["spread"]:
            best = stats, (samples, per)
        if stats["spread"] <= opts.retime_spread or _far_slower(stats["time_ms"], opts, best_ms):
            break
    assert best is not None
    return best[0], best[1], spent, readings


def time_wall(fns: Sequence[Callable[[], None]], opts: TimingOptions) -> Samples:
    """Interpreter: wall-clock samples (meaningless as GPU times; the CLI says so)."""
    out = []
    for i in range(opts.wall_runs):
        t0 = time.perf_counter()
        fns[i % len(fns)]()
        out.append((time.perf_counter() - t0) * 1e3)
    return out, 1


def time_events(fns: Sequence[Callable[[], None]], opts: TimingOptions, l2_bytes: int,
                best_ms: float | None = None) -> Samples:
    """One run per sample between CUDA events, with L2 flushed (a buffer twice its size written) first."""
    import torch

    flush = torch.empty(max(2 * l2_bytes, 1 << 20), dtype=torch.uint8, device="cuda")

    def sample(i: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fns[i % len(fns)]()
        end.record()
        return start, end

    for i in range(opts.warmup):
        fns[i % len(fns)]()
    est = [sample(i) for i in range(3)]
    torch.cuda.synchronize()
    n = _runs_for(statistics.median(s.elapsed_time(e) for s, e in est), opts, best_ms)
    events = [sample(i) for i in range(n)] or est
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events], 1


def time_probe(fn: Callable[[], None], opts: TimingOptions) -> float:
    """One run's GPU time (ms), launched while a spin kernel holds the stream, so the host's launch
    overhead stays out of the reading as it does in a graph replay. ``fn`` must not synchronize (a
    capturable op). Its inputs are warm in L2 from the accuracy check: if anything, the reading is low."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(opts.probe_spin_cycles)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_graph(fns: Sequence[Callable[[], None]], opts: TimingOptions,
               best_ms: float | None = None) -> Samples:
    """Capture ``graph_runs`` runs (cycling the input sets) in one CUDA graph; a sample is one replay's
    time divided by the runs in it. Raises if the op cannot be captured (callers fall back to events)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture requires
        for i in range(max(opts.warmup, len(fns))):
            fns[i % len(fns)]()
    torch.cuda.current_stream().wait_stream(side)
    runs = -(-opts.graph_runs // len(fns)) * len(fns)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(runs):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()

    def sample() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        return start, end

    est = [sample() for _ in range(3)]
    torch.cuda.synchronize()
    n = _runs_for(statistics.median(s.elapsed_time(e) for s, e in est), opts, best_ms, runs)
    events = [sample() for _ in range(n)] or est
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / runs for s, e in events], runs
