"""Measuring on this host's GPUs at once: a measuring worker process per GPU (``--gpus``), one queue.

Candidates first compile on ``jobs`` processes, as in the plain
:class:`~moetune.tuner.backends.process.Runner`, while the GPUs measure what compiled before;
compiled ones go to whichever measuring worker is free. The driver is
:class:`~moetune.tuner.parallel.ParallelSweep`.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo, interpreter_active
from moetune.tuner.backends.base import BusyClock, PoolBackend, WorkerState, same_device
from moetune.tuner.backends.process import WorkerHandle, binary_id


def gpu_count() -> int:
    """CUDA GPUs this process sees (0 under the Triton interpreter)."""
    if interpreter_active():
        return 0
    import torch

    return torch.cuda.device_count()


def parse_gpus(text: str, count: int) -> list[int]:
    """``all`` or comma-separated indices of the ``count`` GPUs this host shows -> the indices, in order."""
    text = text.strip()
    if text.lower() == "all":
        if count < 1:
            raise ValueError("--gpus all: no CUDA GPU is visible on this host")
        return list(range(count))
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--gpus: {part!r} is not a GPU index (give all, or indices such as 0,1)")
        i = int(part)
        if i >= count:
            seen = f"GPUs 0..{count - 1}" if count else "no GPU"
            raise ValueError(f"--gpus: there is no GPU {i} on this host ({seen} visible)")
        if i in ids:
            raise ValueError(f"--gpus: GPU {i} is given twice")
        ids.append(i)
    return ids



BACKLOG = 64  # compiled candidates a GPU may always have waiting before the pool takes no more ...
BACKLOG_S = 20.0  # ... and beyond that, as long as they would keep it busy for less than this (seconds)


class LocalBackend(PoolBackend):
    """One measuring worker process per device index of this host, fed from one queue.

    As in :class:`~moetune.tuner.backends.process.Runner`, candidates first compile on ``jobs``
    processes (default: every core but the measurers' on a GPU, none on the interpreter; spread over
    the GPUs), while the GPUs measure
    what compiled before; one that fails, crashes or hangs there is final. Compiled ones go to
    whichever measuring worker is free. ``devices`` entries are torch
    device indices (one entry per measuring worker; an index given twice puts two on one GPU, whose
    timings then disturb each other); on the interpreter any index works (the workers all run on
    the CPU), which the tests use.
    """

    def __init__(self, devices: Sequence[int | None], *, timeout: float = 60.0, jobs: int | None = None,
                 timing: dict[str, Any] | None = None, log_dir: str | Path | None = None):
        if not devices:
            raise ValueError("--gpus: no GPU given")
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {timeout}")
        if jobs is not None and jobs < 0:
            raise ValueError(f"--jobs must be >= 0, got {jobs}")
        self.devices, self.timeout, self.jobs, self.timing = list(devices), timeout, jobs, dict(timing or {})
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="moetune-workers-") if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = [f"gpu{d}" if d is not None else f"w{i}" for i, d in enumerate(self.devices)]
        names = [f"{n}.{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]  # sharing a GPU
        self.measurers = [WorkerHandle(n, d, self.log_dir) for n, d in zip(names, self.devices, strict=True)]
        self.compilers: list[WorkerHandle] = []
        self.states = {h.name: WorkerState(h.name) for h in self.measurers}
        self.device: DeviceInfo | None = None
        self.versions: dict[str, str] = {}
        self._tasks: dict[Any, tuple[dict[str, Any], str]] = {}  # key -> (task, label), until its result
        self._compile_q: collections.deque = collections.deque()
        self._measure_q: collections.deque = collections.deque()
        self._prefetch_q: collections.deque = collections.deque()  # guessed tasks, compiled when idle
        self._prefetching: set = set()
        self._prefetch_ids = itertools.count()
        self._affinity: dict[str, tuple[Any, Any]] = {}  # compile worker -> the problem it compiled last
        self._bids: dict[Any, Any] = {}  # task key -> its binary (binary_id), until its result
        self.compile_busy = BusyClock()
        self.compile_tasks: list[tuple[float, float]] = []  # (wall s, CPU s) of each compile task
        self._measure_times: collections.deque = collections.deque(maxlen=64)  # recent tasks, seconds
        self._measure_start: dict[Any, float] = {}  # task key -> when a GPU took it

    @property
    def workers(self) -> list[str]:
        return [h.name for h in self.measurers]

    def launch(self) -> None:
        if self.jobs is None:  # a GPU: every core but the measurers' compiles; the interpreter: none
            self.jobs = 0 if interpreter_active() else max(1, (os.cpu_count() or 1) - len(self.measurers))
        if len(self.compilers) != self.jobs:
            self.compilers = [WorkerHandle(f"compile{i}", self.devices[i % len(self.devices)], self.log_dir)
                              for i in range(self.jobs)]
        for h in self.measurers + self.compilers:
            if not h.alive:
                h.launch()

    def start(self) -> DeviceInfo:
        self.launch()
        self.device, self.versions = same_device([h.wait_ready() for h in self.measurers], "--gpus")
        for h in self.measurers:
            self.states[h.name].where = (f"{self.device.name} cuda:{h.device_index}" if self.device.is_gpu
                                         else "cpu (interpreter)")
        return self.device  # compile workers join as they come up (dozens import torch at once)

    def capacity(self) -> int:
        """Tasks it could take now. Without compile workers, one per measuring worker not yet given one.
        With them, one per compile worker with no binary to build (tasks sharing a binary count once: a
        tile's SPLIT_K variants build one), so compiles run ahead of the GPUs, up to ``BACKLOG``
        compiled candidates per GPU, or more while they would keep it busy under ``BACKLOG_S``
        seconds. A fixed cap on the tasks in flight idles the compile workers whenever cached binaries
        make the GPU the bottleneck: the window fills with compiled candidates waiting for it and
        nothing new can start compiling (see docs/tuner.md, "Compile backlog")."""
        if not self.compilers:
            return max(0, len(self.measurers) - len(self._tasks))
        waiting = len(self._measure_q) / len(self.measurers)
        if waiting >= BACKLOG and waiting * self.measure_s() >= BACKLOG_S:
            return 0
        bins = [self._bids[k] for k in self._compile_q] + [h.binary for h in self.compilers if h.busy]
        pending = len({b for b in bins if b is not None}) + bins.count(None)  # None: a binary of its own
        return max(0, len(self.compilers) - pending)

    def measure_s(self) -> float:
        """Median seconds of the last measurements (a GPU's task, start to result); inf before any."""
        return statistics.median(self._measure_times) if self._measure_times else math.inf

    def submit(self, key: Any, task: dict[str, Any], label: str = "") -> None:
        self._tasks[key] = (task, label)
        self._bids[key] = binary_id(task)
        (self._compile_q if self.compilers else self._measure_q).append(key)
        self._dispatch()

    def _dispatch(self) -> None:
        """Start what can start: compiled candidates on free GPUs, queued compiles on free compile workers.

        Compiles only build binaries (warm-up launches, nothing runs on a GPU), so they go on while the
        GPUs measure; the queue of compiled candidates is what keeps every GPU busy."""
        for h in self.measurers:
            if not h.busy and self._measure_q:
                key = self._measure_q.popleft()
                task, label = self._tasks[key]
                h.submit(key, task, self.timeout)
                self._measure_start[key] = time.monotonic()
                self.states[h.name].current = label
        lock = str(self.log_dir / "inputs.lock")
        building = {h.binary for h in self.compilers if h.busy} - {None}
        for h in self.compilers:
            if h.busy or not (self._compile_q or self._prefetch_q):
                continue
            if not h.alive:  # killed by a candidate (or never launched): start again, use it once up
                h.stop()
                h.launch()
            if not h.ready:
                continue
            key = self._next_compile(h, building) if self._compile_q else None
            guess = None if key is not None else next(
                (g for g in self._prefetch_q if binary_id(g) not in building), None)
            if key is not None:
                task = self._tasks[key][0]
            elif guess is not None:  # nothing asked for (or only binaries being built): a guess ahead
                self._prefetch_q.remove(guess)
                task, key = guess, ("prefetch", next(self._prefetch_ids))
                self._prefetching.add(key)
            else:  # every queued binary is being built: the rest will find it in Triton's cache
                continue
            self._affinity[h.name] = (task.get("kernel"), task.get("problem"))
            h.submit(key, {**task, "mode": "compile", "lock": lock}, 2 * self.timeout)
            building.add(h.binary)

    def idle_compilers(self) -> int:
        """Compile workers with nothing to do once the queued compiles (asked and guessed) start."""
        return sum(not h.busy for h in self.compilers) - len(self._compile_q) - len(self._prefetch_q)

    def prefetch(self, task: dict[str, Any]) -> None:
        """Compile a guess (Triton's cache keeps the binary) on a compile worker nothing else needs."""
        self._prefetch_q.append(task)
        self._dispatch()

    def _next_compile(self, h: WorkerHandle, building: set) -> Any:
        """The next compile task for ``h``: one of the problem it compiled last if queued (a compile
        worker keeps one problem's inputs, and making them is slow: a GB of weights), else the oldest;
        never one whose binary another worker is building (None if that leaves none)."""
        last, oldest = self._affinity.get(h.name), None
        for i, key in enumerate(self._compile_q):
            if self._bids[key] in building:
                continue
            task = self._tasks[key][0]
            if (task.get("kernel"), task.get("problem")) == last:
                del self._compile_q[i]
                return key
            oldest = i if oldest is None else oldest
        if oldest is None:
            return None
        key = self._compile_q[oldest]
        del self._compile_q[oldest]
        return key

    def poll(self, wait_s: float = 1.0) -> list[tuple[Any, dict[str, Any], str]]:
        self._dispatch()
        busy = [h for h in self.compilers + self.measurers if h.busy]
        starting = [h.conn for h in self.compilers if h.hello is None and h.conn is not None]
        if not busy and not starting:
            return []
        left = min((h.deadline for h in busy), default=math.inf) - time.monotonic()
        wait([w for h in busy for w in h.waitables()] + starting, min(wait_s, max(0.0, left) + 0.01))
        done = []
        measurers = set(self.workers)
        for h in busy:
            got = h.collect()
            if got is None:
                continue
            key, res = got
            if h.name not in measurers and res.get("wall_ms") is not None:  # a compile worker's
                self.compile_busy.add(time.monotonic(), res["wall_ms"] / 1e3)
                self.compile_tasks.append((res["wall_ms"] / 1e3, res.get("cpu_ms", math.nan) / 1e3))
            if key in self._prefetching:  # a guess compiled (or not): nobody waits for it
                self._prefetching.discard(key)
                continue
            if h.name in measurers:
                self.states[h.name].current = None
                started = self._measure_start.pop(key, None)
                if started is not None:
                    self._measure_times.append(time.monotonic() - started)
            elif res["status"] == "ok":
                self._measure_q.append(key)  # compiled: on to a GPU
                continue
            else:
                res["reason"] = f"while compiling: {res.get('reason') or ''}".strip()
            self._tasks.pop(key)
            self._bids.pop(key, None)
            state = self.states.get(h.name)
            if state is not None:
                state.counts[res["status"]] += 1
            done.append((key, res, h.name))
        self._dispatch()
        return done

    def compiling(self) -> dict[str, float] | None:
        if not self.compile_tasks:
            return None
        wall, cpu = zip(*self.compile_tasks, strict=True)
        share = sum(cpu) / sum(wall) if sum(wall) else math.nan
        return {"tasks": len(self.compile_tasks), "busy": self.compile_busy.fraction(len(self.compilers)),
                "wall_s": statistics.median(wall), "cpu_share": share}

    def close(self) -> None:
        for h in self.measurers + self.compilers:
            h.stop()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
