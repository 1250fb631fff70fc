"""The measuring process: runs candidates where a crash can only take this process down.

The sweep's process never touches the GPU's kernels. Each worker is a spawned
process holding one CUDA context; it answers tasks over a pipe. A candidate that
raises is classified here; one that aborts, segfaults or hangs is seen by the
parent (:mod:`moetune.tuner.backends.process`) as a dead or silent worker. After a CUDA error the
context may be corrupt, so the worker says so and exits, and the parent starts a
new one. Its stdout/stderr go to a log file whose tail becomes the crash reason.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import sys
import time
import traceback
import zlib
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

# Exception names (any module) that mean the config did not compile or does not fit the device.
_COMPILE_ERRORS = {"CompilationError", "OutOfResources", "PTXASError", "CompileTimeAssertionFailure"}
_CUDA_MARKERS = ("CUDA error", "illegal memory access", "device-side assert", "misaligned address",
                 "unspecified launch failure", "an illegal instruction")


def classify(exc: BaseException, on_gpu: bool) -> tuple[str, bool]:
    """(status, restart the worker) for an exception a candidate raised."""
    name, module, text = type(exc).__name__, type(exc).__module__, str(exc)
    if name == "AcceleratorError" or any(m in text for m in _CUDA_MARKERS):
        return "crash", True
    if name in _COMPILE_ERRORS or module.startswith("triton"):
        return "compile_error", False
    if isinstance(exc, ValueError):
        return "invalid", False  # the launcher refused the config
    return "crash", on_gpu  # unknown failure: on a GPU, do not trust the context any more


# Status of a task whose failure was the spec's own (its reference or input maker raised): the point's
# fault, not the config's. Never stored; the sweep stops the point and says why.
POINT_FAILED = "point_failed"


class SpecFailure(Exception):
    """The spec's reference or input maker raised (``stage`` names which): no candidate is to blame."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {describe(exc)}")
        self.stage, self.exc = stage, exc


def _spec_call(stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)``, a failure of it raised as :class:`SpecFailure`, unless it is a CUDA error: those
    may be an earlier candidate's doing (a corrupt context), and restart the worker as a crash."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised, classified
        if type(e).__name__ == "AcceleratorError" or any(m in str(e) for m in _CUDA_MARKERS):
            raise
        raise SpecFailure(stage, e) from e


def describe(exc: BaseException, limit: int = 400) -> str:
    """One line: the CUDA error line when there is one (torch puts hints after it), else the last
    line (Triton puts the source excerpt before its error)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    cuda = [ln for ln in lines if any(m in ln for m in _CUDA_MARKERS)]
    line = cuda[0] if cuda else lines[-1] if lines else ""
    return f"{type(exc).__name__}: {line}".strip()[:limit]


class _Candidate:
    """One candidate's accuracy check and timing inside the worker."""

    def __init__(self, task: dict[str, Any], device: Any):
        from moetune.specs.registry import get_spec

        self.task, self.device = task, device
        try:
            self.spec = get_spec(task["kernel"])
        except ValueError:  # a spec registered at run time (tests, plugins): import its module here
            import importlib

            importlib.import_module(task["spec_module"])
            self.spec = get_spec(task["kernel"])
        self.problem = task["problem"]
        self.config = task["config"]
        self.where = "cuda" if device.is_gpu else "cpu"

    def _sync(self) -> None:
        if self.device.is_gpu:
            import torch

            torch.cuda.synchronize()

    def _run(self, inputs: Any) -> None:
        self.spec.run(inputs, self.config)
        self._sync()

    def compile(self, inputs: Any) -> dict[str, Any]:
        """Go through the launcher once on the real problem so Triton compiles (and caches) this config's
        binaries, with every launch turned into a warm-up: compile workers share the GPU with the
        measuring worker, and a kernel of theirs running during a timed replay would skew it."""
        with compile_only():
            self._run(inputs)
        return {"status": "ok"}

    def measure(self, inputs: Any) -> dict[str, Any]:
        from moetune.tuner.timing import (
            TimingOptions,
            steadiest,
            summarize,
            time_events,
            time_graph,
            time_probe,
            time_wall,
        )

        spec, problem = self.spec, self.problem
        clock = _Phases(self._sync)
        expected = _spec_call("reference", spec.reference, inputs)
        clock.lap("reference")
        spec.poison(inputs)
        self._run(inputs)
        spec.collect(inputs, self.config)
        err = float(spec.error(inputs.outputs, expected))
        out: dict[str, Any] = {"error": err, "bytes": int(spec.bytes_moved(problem, inputs)),
                               "flops": int(spec.flops(problem, inputs)), "phases_ms": clock.ms}
        clock.lap("check")
        if not spec.passes(err):
            limit = "bit-exact" if spec.exact else f"tolerance {spec.tolerance:g}"
            return {**out, "status": "inaccurate", "reason": f"error {err:.3g} vs reference ({limit})"}
        opts = TimingOptions(**self.task.get("timing", {}))
        reason, best = None, self.task.get("best_ms")
        if self.device.is_gpu and spec.cuda_graph and best and opts.probe and opts.slow_ratio:
            probe = time_probe(lambda: spec.run(inputs, self.config), opts)
            if probe > opts.slow_ratio * best:
                clock.lap("timing")
                note = f"far slower: one run, {probe / best:.1f}x the point's best so far, timed alone"
                return self._timed(out, summarize([probe]), note, probe)
        sets = [inputs] + [make_inputs(self, self.task["seed"] + i, i)
                           for i in range(1, self._input_sets(out["bytes"]))]
        clock.lap("timing_sets")
        fns = [lambda s=s: spec.run(s, self.config) for s in sets]
        method = "wall" if not self.device.is_gpu else "graph" if spec.cuda_graph else "events"

        def take() -> tuple[list[float], int]:
            nonlocal method, reason
            if method == "wall":  # the arch column ("interpreter") marks these times as meaningless
                return time_wall(fns, opts)
            if method == "graph":
                try:
                    return time_graph(fns, opts, best)
                except RuntimeError as e:  # not capturable: still time it, and say how
                    if any(m in str(e) for m in _CUDA_MARKERS):
                        raise
                    method = "events"
                    reason = f"timed without a CUDA graph (capture failed: {describe(e, 120)})"
            return time_events(fns, opts, self.device.l2_bytes, best)

        # On the GPU a wide spread marks another process's work in the timed window: time it again
        stats, _, spent, readings = steadiest(
            take, opts if self.device.is_gpu else replace(opts, retimes=0), best)
        if readings > 1:
            note = f"timed {readings} times (spread above {opts.retime_spread:.0%}), the steadiest kept"
            reason = f"{reason}; {note}" if reason else note
        clock.lap("timing")
        return self._timed(out, stats, reason, spent)

    def _timed(self, out: dict[str, Any], stats: dict[str, Any], reason: str | None,
               kernel_ms: float) -> dict[str, Any]:
        from moetune.tuner.timing import roofline_frac

        frac = roofline_frac(self.device.name, out["bytes"], out["flops"], stats["time_ms"],
                             getattr(self.spec, "mma", "bf16")) if self.device.is_gpu else None
        return {**out, **stats, "status": "ok", "reason": reason, "roofline_frac": frac,
                "kernel_ms": kernel_ms}

    def _input_sets(self, nbytes: int) -> int:
        """Rotate input sets when one fits in L2 twice over, so runs do not hit each other's cache."""
        l2 = self.device.l2_bytes
        if not self.device.is_gpu or not l2 or nbytes >= 2 * l2:
            return 1
        return min(4, -(-2 * l2 // max(nbytes, 1)))


class _Phases:
    """Milliseconds per phase of a task (synchronized, so GPU work lands in the phase that queued it)."""

    def __init__(self, sync: Any) -> None:
        self.sync, self.ms, self.t = sync, {}, time.perf_counter()

    def lap(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self.t) * 1e3
        self.t = now


class _WeightPool:
    """A worker's weight sets for the current (kernel, shape): each made once, on first use, and
    reused by every candidate (the weights are the gigabyte-sized, config-independent part of the
    inputs). Set 0 backs every accuracy check; sets 1..3 only back the L2-rotating timing sets.
    Weights are made one worker at a time (a file lock), so sixteen compile workers never hold
    sixteen transient generation peaks at once."""

    def __init__(self) -> None:
        self.key: Any = None
        self.sets: dict[int, Any] = {}

    def get(self, cand: _Candidate, index: int, lock_path: str | None = None) -> Any:
        key = (cand.spec.name, cand.problem.shape_key)
        if key != self.key:
            self.key, self.sets = key, {}  # free the previous shape's tensors first
        if index not in self.sets:
            seed = zlib.crc32(f"weights|{key}|{index}".encode()) & 0x7FFFFFFF
            with _file_lock(lock_path):
                self.sets[index] = _spec_call("make_weights", cand.spec.make_weights, cand.problem,
                                              cand.where, seed)
                _release_temporaries(cand)
        return self.sets[index]


def _release_temporaries(cand: _Candidate) -> None:
    """Give the GPU memory that generating inputs needed back to the other workers: the caching
    allocator would keep the peak (gigabytes at DeepSeek-V3 TP1) in every process for good."""
    cand._sync()
    if cand.device.is_gpu:
        import torch

        torch.cuda.empty_cache()


def make_inputs(cand: _Candidate, seed: int, weight_set: int = 0, lock_path: str | None = None,
                pool: _WeightPool | None = None) -> Any:
    """Fresh activations, routes and outputs (``seed``) on the pool's weight set ``weight_set`` (the
    worker's own pool unless ``pool``); a spec without :meth:`~moetune.specs.base.KernelSpec.make_weights`
    makes everything fresh, as before."""
    weights = (pool or _WEIGHTS).get(cand, weight_set, lock_path)
    if weights is None:
        inputs = _spec_call("make_inputs", cand.spec.make_inputs, cand.problem, cand.where, seed)
    else:
        inputs = _spec_call("make_inputs", cand.spec.make_inputs, cand.problem, cand.where, seed,
                            weights=weights)
    if cand.task.get("timing", {}).get("kernel_only"):  # see TimingOptions.kernel_only
        inputs.extra["kernel_only"] = True
    return inputs


class _CompileInputs:
    """A compile worker's inputs for the current problem: made once per problem, not per config
    (only the binary matters there), for the spec's :meth:`~moetune.specs.base.KernelSpec.compile_problem`.
    Its weights come from a pool, made once per shape one worker at a time: the measurements' pool
    when the stand-in is the problem itself, else a pool of stand-in weights (fewer experts, still
    gigabytes at DeepSeek-V3 TP1: dozens of workers drawing them at once run a GPU out of memory)."""

    def __init__(self) -> None:
        self.key: Any = None
        self.inputs: Any = None
        self.stand_in_weights = _WeightPool()

    def get(self, cand: _Candidate, seed: int, lock_path: str | None) -> Any:
        key = (cand.spec.name, cand.problem)
        if key != self.key:
            self.key = self.inputs = None  # free the previous problem's tensors first
            stand_in = cand.spec.compile_problem(cand.problem)
            if stand_in == cand.problem:
                self.inputs = make_inputs(cand, seed, 0, lock_path)
            else:
                sub = copy.copy(cand)
                sub.problem = stand_in
                self.inputs = make_inputs(sub, seed, 0, lock_path, self.stand_in_weights)
            cand._sync()
            self.key = key
        return self.inputs


@contextlib.contextmanager
def compile_only() -> Iterator[None]:
    """Triton kernels launched inside only compile (``warmup=True``: binary built and cached, nothing
    runs). Torch ops still run. Under the interpreter kernels are not JIT functions and run as usual."""
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run

    def warm(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = warm
    try:
        yield
    finally:
        JITFunction.run = launch


@contextlib.contextmanager
def _file_lock(path: str | None) -> Iterator[None]:
    if path is None:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_WEIGHTS = _WeightPool()
_COMPILE_INPUTS = _CompileInputs()


def _yield_cpu() -> None:
    """Lower this process's CPU priority, once: a compile worker's process only ever compiles, and
    dozens of them must not slow the measuring worker's host work (inputs, reference, launches)."""
    global _NICED
    if not _NICED:
        _NICED = True
        try:
            os.nice(COMPILE_NICE)
        except (AttributeError, OSError):  # no os.nice (Windows) or not allowed: run as is
            pass


_NICED = False
COMPILE_NICE = 10


def handle(task: dict[str, Any], device: Any) -> dict[str, Any]:
    """Run one task; every failure a candidate can raise becomes a status and a reason.

    A measurement makes fresh activations, routes and outputs (its own seed) for every candidate on
    the worker's pooled weights; a compile reuses the problem's inputs.
    """
    t0, cpu0 = time.perf_counter(), _cpu_s()
    stage = "setup"
    try:
        cand = _Candidate(task, device)
        t_setup = time.perf_counter()
        stage = "make_inputs"
        if task["mode"] == "compile":
            _yield_cpu()
            inputs = _COMPILE_INPUTS.get(cand, task["seed"], task.get("lock"))
        else:
            inputs = make_inputs(cand, task["seed"])
        t_made = time.perf_counter()
        cand._sync()
        t_synced = time.perf_counter()
        stage = "run"
        result = cand.compile(inputs) if task["mode"] == "compile" else cand.measure(inputs)
        if "phases_ms" in result:  # disjoint phases: the fresh inputs split so a slow part shows
            result["phases_ms"].update(setup=(t_setup - t0) * 1e3, inputs_host=(t_made - t_setup) * 1e3,
                                       inputs_sync=(t_synced - t_made) * 1e3)
    except SpecFailure as e:  # the point's fault: the sweep stores nothing against the config
        traceback.print_exc()
        result = {"status": POINT_FAILED, "reason": f"{e.stage} failed: {describe(e.exc)}",
                  "restart": device.is_gpu, "stage": e.stage}
    except Exception as e:  # noqa: BLE001 - every failure is data here
        status, restart = classify(e, device.is_gpu)
        if stage != "run":
            status, restart = "crash", restart or device.is_gpu
        reason = describe(e) if stage == "run" else f"{stage} failed: {describe(e)}"
        traceback.print_exc()  # into the worker's log, for whoever digs deeper
        result = {"status": status, "reason": reason, "restart": restart, "stage": stage}
    result["wall_ms"] = (time.perf_counter() - t0) * 1e3
    if task["mode"] == "compile":  # wall time well above CPU time: the compile waited on something
        result["cpu_ms"] = (_cpu_s() - cpu0) * 1e3
    return result


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (ptxas runs as one)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the sweep dies (even by SIGKILL), so no orphan holds the GPU."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def main(conn: Any, log_path: str, device_index: int | None, interpret: bool = False) -> None:
    """Entry point of a spawned worker: say hello with the device and versions, then serve tasks.

    ``interpret``: no GPU here, run kernels through the Triton interpreter (set before triton loads).
    """
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's to handle
    _die_with_parent()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import faulthandler

    faulthandler.enable()  # a segfault leaves a Python stack in the log
    import torch
    import triton

    from moetune import __version__
    from moetune.device import device_info

    if device_index is not None and torch.cuda.is_available():
        torch.cuda.set_device(device_index)
        # the GPU does a worker's work; an intra-op thread pool per worker (one per core) only makes
        # dozens of processes' CPU ops wait on threads their neighbours' compiles have descheduled
        torch.set_num_threads(1)
    device = device_info(device_index)
    conn.send({"device": asdict(device), "versions": {
        "moetune_version": __version__, "triton_version": triton.__version__,
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda}})
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        result = handle(task, device)
        sys.stdout.flush()
        conn.send(result)
        if result.get("restart"):
            os._exit(3)  # the context may be corrupt; the parent starts a fresh worker
