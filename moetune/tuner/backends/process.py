"""Worker processes, and the plain backend: compile candidates in parallel, measure them one at a time.

A :class:`WorkerPool` keeps spawned :mod:`moetune.tuner.worker` processes busy with
tasks and turns every way a task can end into a result: an answer, a dead
process (``crash``, with the signal and the tail of its log) or silence past the
timeout (``timeout``, the process is killed). A dead or killed worker is started
again before its next task, so one bad candidate never stops a sweep. Every backend
runs its candidates in these processes.

:class:`Runner` uses two pools: ``jobs`` compile workers that take each candidate
through its launcher once on the real problem with every Triton launch turned into
a warm-up (compiled and cached on disk, shared across processes, but not run, so
nothing of theirs lands on the GPU during a timed run), and one measuring worker
that checks accuracy and times each candidate. Compiling overlaps measuring: a
candidate is measured as soon as its compile is done, and the compile workers go on
with the next batch meanwhile. A candidate that fails to compile, crashes or hangs
in the compile stage is final: it is not run again (unless the failure came before
the config ran, such as no memory for the inputs).
"""

from __future__ import annotations

import collections
import functools
import math
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo, interpreter_active
from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec
from moetune.tuner.backends.base import SequentialBackend, measure_task

STARTUP_TIMEOUT_S = 600.0  # importing torch and triton, creating a CUDA context


@functools.cache
def _needs_interpreter() -> bool:
    """No GPU and TRITON_INTERPRET unset: workers must run kernels through the interpreter
    (it has to be set before a process imports triton, so the worker sets it first thing)."""
    import torch

    return not interpreter_active() and not torch.cuda.is_available()


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def binary_id(task: dict[str, Any]) -> Any:
    """The binary a task runs (kernel, problem, :meth:`~moetune.specs.base.KernelSpec.binary_key`), so that
    two workers never build one at once; None for a task that does not say (or whose spec only its
    worker imports, ``spec_module``), which never waits."""
    if not {"kernel", "problem", "config"} <= task.keys():
        return None
    try:
        spec = get_spec(task["kernel"])
    except ValueError:
        return None
    return task["kernel"], task["problem"].describe(), spec.binary_key(task["config"])


class WorkerHandle:
    """One worker process and the task it is running (at most one)."""

    def __init__(self, name: str, device_index: int | None, log_dir: Path):
        self.name, self.device_index = name, device_index
        self.log_path = log_dir / f"{name}.log"
        self.proc: Any = None
        self.conn: Any = None
        self.hello: dict[str, Any] | None = None
        self.task_key: Any = None
        self.binary: Any = None  # binary_id of the running task
        self.deadline = 0.0
        self.started_at = 0.0
        self.launched_at = 0.0
        self._log_offset = 0

    # ---- life cycle --------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    @property
    def busy(self) -> bool:
        return self.task_key is not None

    def launch(self) -> None:
        from moetune.tuner import worker

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker.main,
                                args=(child, str(self.log_path), self.device_index, _needs_interpreter()),
                                name=f"moetune-{self.name}", daemon=True)
        self.proc.start()
        child.close()
        self.conn, self.hello, self.launched_at = parent, None, time.monotonic()

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> dict[str, Any]:
        if self.hello is None:
            if not self.conn.poll(timeout):
                self.stop()
                raise RuntimeError(f"worker {self.name} did not start within {timeout:.0f} s")
            try:
                self.hello = self.conn.recv()
            except EOFError:
                self.proc.join(5)
                raise RuntimeError(f"worker {self.name} died while starting "
                                   f"({_signal_name(self.proc.exitcode)}): {self._log_tail(0)}") from None
        return self.hello

    @property
    def ready(self) -> bool:
        """Started and said hello (never blocks; RuntimeError if it died while starting, or is still
        starting past the start-up limit: a sweep must fail, not wait forever, on a stuck worker)."""
        if self.hello is None and self.conn is not None:
            if self.conn.poll(0):
                self.wait_ready(0)
            elif time.monotonic() - self.launched_at > STARTUP_TIMEOUT_S:
                self.stop()
                raise RuntimeError(f"worker {self.name} did not start within {STARTUP_TIMEOUT_S:.0f} s")
        return self.hello is not None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
            self.conn.close()
        self.proc = self.conn = None
        self.task_key = None

    # ---- tasks ---------------------------------------------------------------------------------------
    def submit(self, key: Any, task: dict[str, Any], timeout: float) -> None:
        if not self.alive:
            self.stop()
            self.launch()
        self.wait_ready()
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.task_key, self.started_at, self.deadline = key, time.monotonic(), time.monotonic() + timeout
        self.binary = binary_id(task)
        self.conn.send(task)

    def waitables(self) -> list[Any]:
        return [self.conn, self.proc.sentinel] if self.busy else []

    def collect(self) -> tuple[Any, dict[str, Any]] | None:
        """The finished task's (key, result), or None while it is still running in time."""
        if not self.busy:
            return None
        key, result = self.task_key, None
        if self.conn.poll():
            try:
                result = self.conn.recv()
            except (EOFError, OSError):
                result = None
            if result is not None and result.get("restart"):
                self.proc.join(10)  # it exits by itself after a CUDA error
                self.stop()
        if result is None and not self.proc.is_alive():
            self.proc.join(1)
            why = _signal_name(self.proc.exitcode)
            result = {"status": "crash", "reason": f"worker died ({why}): {self._log_tail(self._log_offset)}"}
            self.stop()
        if result is None and time.monotonic() > self.deadline:
            limit = self.deadline - self.started_at
            result = {"status": "timeout", "reason": f"no result within {limit:g} s; worker killed"}
            self.stop()
        if result is None:
            return None
        self.task_key = None
        result["parent_ms"] = (time.monotonic() - self.started_at) * 1e3
        return key, result

    def _log_tail(self, offset: int, limit: int = 300) -> str:
        """The most telling line the task left in the log: an error line if any, else the last one."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        if not lines:
            return "no output"
        errors = [ln for ln in lines if "error" in ln.lower() or "abort" in ln.lower()]
        return (errors[0] if errors else lines[-1])[:limit]


class WorkerPool:
    """Worker processes sharing a queue of tasks; results come back as they finish.

    :meth:`run` drives the pool to completion; :meth:`add`, :meth:`pump`, :meth:`waitables` and
    :meth:`harvest` let a caller drive two pools from one loop (compile ahead while measuring).
    """

    def __init__(self, size: int, prefix: str, device_index: int | None, log_dir: Path):
        self.handles = [WorkerHandle(f"{prefix}{i}", device_index, log_dir) for i in range(size)]
        self.queue: collections.deque = collections.deque()  # (key, task, timeout, admit, binary_id)

    def launch(self) -> None:
        """Start the worker processes without waiting for them (:meth:`start` waits)."""
        for h in self.handles:
            if not h.alive:
                h.launch()

    def start(self) -> dict[str, Any]:
        self.launch()
        return [h.wait_ready() for h in self.handles][0]

    def add(self, tasks: Iterable[tuple[Any, dict[str, Any]]], timeout: float,
            admit: Callable[[Any], bool] | None = None, front: bool = False) -> None:
        items = [(key, task, timeout, admit, binary_id(task)) for key, task in tasks]
        if front:
            self.queue.extendleft(reversed(items))
        else:
            self.queue.extend(items)

    def pump(self, ready_only: bool = False) -> None:
        """Start queued tasks on idle workers; ``admit(key)`` is asked just before a task starts.
        ``ready_only``: never wait for a worker to start; one still starting (or just started again) joins
        when it has said hello (a pool that was only launched comes up while tasks queue)."""
        for h in self.handles:
            if ready_only:
                if h.busy:  # running, or dead with a task whose crash only harvest() may collect
                    continue
                if not h.alive:  # never launched, or killed by a task harvest() has collected
                    h.stop()
                    h.launch()
                try:
                    if not h.ready:
                        continue
                except RuntimeError:  # died while starting: start it again on the next pump
                    h.stop()
                    continue
            while not h.busy:
                # never a task whose binary another worker is building: it will be in Triton's cache
                building = {w.binary for w in self.handles if w.busy} - {None}
                item = next((i for i in self.queue if i[4] not in building), None)
                if item is None:
                    break
                self.queue.remove(item)
                key, task, timeout, admit, _ = item
                if admit is None or admit(key):
                    h.submit(key, task, timeout)

    @property
    def busy(self) -> bool:
        return any(h.busy for h in self.handles)

    def waitables(self) -> list[Any]:
        return [w for h in self.handles for w in h.waitables()]

    def next_deadline(self) -> float:
        return min((h.deadline for h in self.handles if h.busy), default=math.inf)

    def harvest(self) -> list[tuple[Any, dict[str, Any]]]:
        """(key, result) of every task that finished (or died, or timed out) by now."""
        return [done for h in self.handles if h.busy and (done := h.collect()) is not None]

    def run(self, tasks: Iterable[tuple[Any, dict[str, Any]]], timeout: float,
            admit: Callable[[Any], bool] | None = None) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Yield (key, result) for each task; ``admit(key)`` is asked just before a task starts."""
        self.add(tasks, timeout, admit)
        while True:
            self.pump()
            if not self.busy:
                return
            wait(self.waitables(), max(0.0, self.next_deadline() - time.monotonic()) + 0.01)
            yield from self.harvest()

    def stop(self) -> None:
        self.queue.clear()
        for h in self.handles:
            h.stop()


class Runner(SequentialBackend):
    """Measures candidates of one problem at a time; the sweep writes what it yields to the store."""

    def __init__(self, *, timeout: float = 60.0, jobs: int | None = None, device_index: int | None = None,
                 timing: dict[str, Any] | None = None, log_dir: str | Path | None = None):
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {timeout}")
        if jobs is not None and jobs < 0:
            raise ValueError(f"--jobs must be >= 0, got {jobs}")
        self.timeout, self.jobs, self.timing = timeout, jobs, dict(timing or {})
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="moetune-workers-") if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.measurer = WorkerPool(1, "gpu", device_index, self.log_dir)
        self.compiler: WorkerPool | None = None
        self.device_index = device_index
        self.device: DeviceInfo | None = None
        self.versions: dict[str, str] = {}
        self.compile_seconds = 0.0  # waiting on compiles with nothing to measure
        self.compiled = 0
        self._compiled: dict[tuple[str, str], dict[str, Any]] = {}  # (problem, config) -> compile result
        self._compiling: set[tuple[str, str]] = set()

    def launch(self) -> None:
        self.measurer.launch()

    def start(self) -> DeviceInfo:
        hello = self.measurer.start()
        self.device = DeviceInfo(**hello["device"])
        self.versions = hello["versions"]
        if self.jobs is None:  # a GPU: compile on every core but the measurer's (they overlap now);
            self.jobs = max(1, (os.cpu_count() or 1) - 1) if self.device.is_gpu else 0  # interpreter: none
        return self.device

    def close(self) -> None:
        self.measurer.stop()
        if self.compiler is not None:
            self.compiler.stop()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _task(self, mode: str, spec: KernelSpec, problem: Problem, config: Config,
              seed: int, best_ms: float | None = None) -> dict[str, Any]:
        return {**measure_task(spec, problem, config, seed, self.timing, best_ms), "mode": mode}

    def _compile_ahead(self, spec: KernelSpec, problem: Problem, configs: Iterable[Config], seed: int,
                       front: bool = False) -> None:
        """Queue compile tasks for the configs not compiled or queued yet (``front``: before the rest)."""
        if not self.jobs:
            return
        if self.compiler is None:
            self.compiler = WorkerPool(self.jobs, "compile", self.device_index, self.log_dir)
            self.compiler.start()
        lock = str(self.log_dir / "inputs.lock")
        where = problem.describe()
        stale = [item for item in self.compiler.queue if item[0][0] != where]
        if stale:  # another problem's compiles not started yet (its sweep moved on): drop them
            self.compiler.queue = collections.deque(i for i in self.compiler.queue if i[0][0] == where)
            self._compiling.difference_update(item[0] for item in stale)
        tasks = []
        for c in configs:
            key = (where, canonical_json(c))
            if key not in self._compiled and key not in self._compiling:
                self._compiling.add(key)
                tasks.append((key, {**self._task("compile", spec, problem, c, seed), "lock": lock}))
        self.compiler.add(tasks, 2 * self.timeout, front=front)

    def _harvest_compiles(self) -> None:
        if self.compiler is not None:
            for key, res in self.compiler.harvest():
                self._compiling.discard(key)
                self._compiled[key] = res
                self.compiled += 1

    def _wait(self) -> None:
        pools = [p for p in (self.measurer, self.compiler) if p is not None]
        deadline = min(p.next_deadline() for p in pools)
        ws = [w for p in pools for w in p.waitables()]
        if ws:
            wait(ws, min(1.0, max(0.0, deadline - time.monotonic()) + 0.01))

    def compile(self, spec: KernelSpec, problem: Problem, configs: Sequence[Config],
                seed: int = 0) -> dict[str, dict[str, Any]]:
        """Compile stage on ``jobs`` processes: config key -> result (status ok when it compiled)."""
        if not self.jobs:
            return {}
        t0 = time.monotonic()
        self._compile_ahead(spec, problem, configs, seed, front=True)
        keys = [(problem.describe(), canonical_json(c)) for c in configs]
        while any(k not in self._compiled for k in keys):
            self.compiler.pump()
            self._wait()
            self._harvest_compiles()
        self.compile_seconds += time.monotonic() - t0
        return {k[1]: self._compiled[k] for k in keys}

    def measure(self, spec: KernelSpec, problem: Problem, configs: Sequence[Config], seed: int = 0,
                admit: Callable[[Config], bool] | None = None,
                ahead: Sequence[Config] = (), best_ms: float | Callable[[], float | None] | None = None
                ) -> Iterator[tuple[Config, dict[str, Any]]]:
        """Yield (config, result) per candidate as each finishes; ``admit`` may skip one just before
        it runs (another sweep on the same store measured it meanwhile). ``best_ms``: the point's best
        time so far, or a function that tells it as each candidate is sent (so a batch's later candidates
        see its earlier results); candidates far slower get fewer timed runs
        (:class:`~moetune.tuner.timing.TimingOptions`).

        Each candidate is measured as soon as its compile is done, while the compile workers go on
        with the rest and then with ``ahead`` (the next batch), so compiling overlaps measuring.
        """
        if self.device is None:
            self.start()
        # Measurements an earlier call queued but its caller stopped reading (a time limit): their
        # admit callbacks belong to that caller (its store may be closed), so they never start.
        self.measurer.queue.clear()
        by_key = {canonical_json(c): dict(c) for c in configs}
        where = problem.describe()
        self._compile_ahead(spec, problem, by_key.values(), seed, front=True)
        self._compile_ahead(spec, problem, ahead, seed)
        waiting, left = list(by_key), set(by_key)

        def check(key: str) -> bool:
            if admit is None or admit(by_key[key]):
                return True
            left.discard(key)
            return False

        while left:
            still = []
            for key in waiting:
                res = self._compiled.get((where, key)) if self.jobs else None
                if self.jobs and res is None:
                    still.append(key)
                # Final unless the compile worker failed before running the config (e.g. out of memory
                # making inputs): that says nothing about the config, so it is measured as usual.
                elif res is not None and res["status"] != "ok" and res.get("stage", "run") == "run":
                    if check(key):
                        left.discard(key)
                        yield by_key[key], {**res, "reason": f"while compiling: {res.get('reason') or ''}"
                                            .strip()}
                else:
                    best = best_ms() if callable(best_ms) else best_ms
                    self.measurer.add([(key, self._task("measure", spec, problem, by_key[key], seed, best))],
                                      self.timeout, check)
            waiting = still
            self.measurer.pump()
            if self.compiler is not None:
                self.compiler.pump()
            if not left:
                break
            t0 = time.monotonic()
            self._wait()
            if not self.measurer.busy:  # the GPU waited for a compile
                self.compile_seconds += time.monotonic() - t0
            self._harvest_compiles()
            for key, res in self.measurer.harvest():
                if key in left:  # not a leftover of an earlier call its caller stopped reading
                    left.discard(key)
                    yield by_key[key], res
