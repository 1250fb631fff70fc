"""Ray actors as measuring workers: ``moetune sweep --ray`` over every GPU of a Ray cluster.

Ray places the actors (one GPU each, or a share of one with ``gpus_per_actor`` < 1
so several actors use one GPU, their timings then disturbing each other); the
driver keeps each actor supplied with tasks and takes results back one by one as
they finish, so the sweep process stays the only writer of the store. Each
actor runs the same spawned worker processes as a local sweep (:mod:`moetune.tuner.worker`:
a compile stage, then one measuring process), on its own node, where the kernel
compiles and runs: a candidate that aborts, segfaults or hangs takes down only
that process, and the actor reports ``crash``/``timeout`` exactly as a local backend
does and starts a new one. An actor that dies itself (its node lost, ``ray.kill``)
loses only the tasks it held: they go back to the front of the queue and a new
actor takes its place. A candidate that has lost ``max_losses``
actors is recorded as a crash, so one that somehow kills its actor cannot stall
the sweep.

Ray is an optional extra; every node needs moetune (and any plugin specs) installed.
"""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo
from moetune.tuner.backends.base import PoolBackend, WorkerState, same_device
from moetune.tuner.backends.process import STARTUP_TIMEOUT_S, WorkerPool

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'moetune[ray]'"
MAX_LOSSES = 3
AHEAD = 2  # tasks an actor holds per compile process: the next ones compile while one is measured
COLLECT_WAIT_S = 0.5  # how long one collect() call waits for a result (tasks added meanwhile queue behind it)


def import_ray() -> Any:
    """The ``ray`` module, or a ValueError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


class MeasureActor:
    """Lives in a Ray actor process: moetune worker processes on the GPU (share) Ray gave the actor.

    Tasks stream in (:meth:`add`) and results out (:meth:`collect`, which the driver keeps calling
    while the actor has work): each compiles on one of ``jobs`` processes (Triton warm-ups: binaries
    cached, nothing run; one that fails there is final, as in
    :class:`~moetune.tuner.backends.process.Runner`) and is measured by one measuring process as soon
    as it compiled. Ray sets CUDA_VISIBLE_DEVICES for the actor; its
    worker processes inherit it.
    """

    def __init__(self, name: str, jobs: int = 0):
        self.log_dir = Path(tempfile.mkdtemp(prefix="moetune-ray-"))
        self.measurer = WorkerPool(1, name, None, self.log_dir)
        self.compiler = WorkerPool(jobs, f"{name}-compile", None, self.log_dir) if jobs else None
        self._tasks: dict[int, tuple[dict[str, Any], float]] = {}  # id -> (task, timeout) until its result
        self._failed: str | None = None  # why add() failed: the driver does not wait on add(), collect() says

    def hello(self) -> dict[str, Any]:
        """The worker's device and versions, plus where this actor runs."""
        import socket

        hello = self.measurer.start()
        if self.compiler is not None:  # they join as they come up: dozens import torch at once
            self.compiler.launch()
        return {**hello, "host": socket.gethostname(), "pid": os.getpid(),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    def add(self, tasks: list[tuple[int, dict[str, Any]]], timeout: float) -> None:
        """Queue tasks (id, task) and return at once; :meth:`collect` drives them and hands results back
        (or raises what went wrong here: nobody waits on this call, and its tasks would never end)."""
        try:
            for tid, task in tasks:
                self._tasks[tid] = (task, timeout)
            if self.compiler is None:
                self.measurer.add(tasks, timeout)
            else:
                lock = str(self.log_dir / "inputs.lock")
                self.compiler.add([(tid, {**t, "mode": "compile", "lock": lock}) for tid, t in tasks],
                                  2 * timeout)
            self._pump()
        except Exception as e:
            self._failed = f"adding tasks: {type(e).__name__}: {e}"
            raise

    def collect(self, wait_s: float) -> list[tuple[int, dict[str, Any]]]:
        """(id, result) of the tasks that ended, waiting up to ``wait_s`` for the first; every way a
        candidate can end is a result (a worker it kills is started again). A compiled candidate goes
        to the measuring process at once, while the others still compile (compiles are warm-ups:
        nothing of theirs runs on the GPU)."""
        if self._failed:
            raise RuntimeError(self._failed)
        end = time.monotonic() + wait_s
        while True:
            done = self._harvest()
            if done or not self._tasks or time.monotonic() >= end:
                return done
            pools = [p for p in (self.compiler, self.measurer) if p is not None]
            left = min(end, *(p.next_deadline() for p in pools)) - time.monotonic()
            wait([w for p in pools for w in p.waitables()], max(0.0, left) + 0.01)

    def _pump(self) -> None:
        if self.compiler is not None:
            self.compiler.pump(ready_only=True)
        self.measurer.pump()

    def _harvest(self) -> list[tuple[int, dict[str, Any]]]:
        done = []
        if self.compiler is not None:
            for tid, res in self.compiler.harvest():
                if res["status"] == "ok":
                    task, timeout = self._tasks[tid]
                    self.measurer.add([(tid, task)], timeout)
                else:
                    res["reason"] = f"while compiling: {res.get('reason') or ''}".strip()
                    done.append((tid, res))
        self._pump()
        done += self.measurer.harvest()
        self._pump()
        for tid, _ in done:
            self._tasks.pop(tid, None)
        return done

    def close(self) -> None:
        self.measurer.stop()
        if self.compiler is not None:
            self.compiler.stop()
        shutil.rmtree(self.log_dir, ignore_errors=True)


class RayBackend(PoolBackend):
    """Actors across a Ray cluster (``address``, default: start a local one), fed from one queue.

    ``actors`` defaults to the cluster's GPUs divided by ``gpus_per_actor``; a cluster with no
    GPU gets one CPU actor per CPU (the Triton interpreter: accuracy checks only). ``jobs`` is the
    compile processes per actor (default: the cluster's CPUs shared out over the actors on GPUs,
    none on the interpreter); an actor takes a batch of that many candidates at a time.
    """

    def __init__(self, *, address: str | None = None, actors: int | None = None, gpus_per_actor: float = 1.0,
                 timeout: float = 60.0, jobs: int | None = None, timing: dict[str, Any] | None = None,
                 max_losses: int = MAX_LOSSES):
        if actors is not None and actors < 1:
            raise ValueError(f"--ray-actors must be >= 1, got {actors}")
        if not 0 < gpus_per_actor <= 1:
            raise ValueError(f"--ray-gpus-per-actor must be in (0, 1], got {gpus_per_actor}")
        if timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {timeout}")
        if jobs is not None and jobs < 0:
            raise ValueError(f"--jobs must be >= 0, got {jobs}")
        if max_losses < 1:
            raise ValueError(f"max_losses must be >= 1, got {max_losses}")
        self.ray = import_ray()
        self.address, self.n_actors, self.gpus_per_actor = address, actors, gpus_per_actor
        self.timeout, self.jobs, self.timing, self.max_losses = timeout, jobs, dict(timing or {}), max_losses
        self.device: DeviceInfo | None = None
        self.versions: dict[str, str] = {}
        self.actors: list[Any] = []
        self.states: dict[str, WorkerState] = {}  # one per actor, from launch()
        self._actor_cls: Any = None
        self._opts: dict[str, Any] = {}
        self._hellos: list[Any] | None = None  # the actors' hello() calls, from launch() until start()
        self._launch_error: BaseException | None = None
        self._own_cluster = False
        self._tasks: dict[Any, tuple[dict[str, Any], str]] = {}
        self._queue: collections.deque = collections.deque()
        self._pending: collections.defaultdict = collections.defaultdict(dict)  # slot -> {task id: key}
        self._collecting: dict[Any, int] = {}  # the one collect() call in flight per busy actor -> slot
        self._asked: dict[Any, float] = {}  # that call -> when it was made
        self._ids = itertools.count()
        self.losses: collections.Counter = collections.Counter()  # key -> actors lost while running it

    def launch(self) -> None:
        """Start (or join) the cluster and create the actors without waiting for them, so they start
        while the sweep plans; :meth:`start` waits. A failure here is raised by :meth:`start`."""
        if self._hellos is not None or self._launch_error is not None:
            return
        try:
            self._launch()
        except Exception as e:  # noqa: BLE001 - start() raises it where the CLI reports start-up errors
            self._launch_error = e

    def _launch(self) -> None:
        ray = self.ray
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            self._own_cluster = True
        gpus, cpus = ray.cluster_resources().get("GPU", 0.0), int(ray.cluster_resources().get("CPU", 1))
        if gpus:
            n = self.n_actors or int(gpus / self.gpus_per_actor + 1e-9)
            self.jobs = max(1, cpus // n) if self.jobs is None else self.jobs
        else:
            n = self.n_actors or max(1, cpus)
            self.jobs = self.jobs or 0
        opts = {"num_gpus": self.gpus_per_actor if gpus else 0, "num_cpus": max(1, self.jobs)}
        self._actor_cls = ray.remote(max_restarts=0, **opts)(MeasureActor)
        self.states = {f"actor{i}": WorkerState(f"actor{i}") for i in range(n)}
        self.actors = [self._new_actor(i) for i in range(n)]
        self._opts = opts
        self._hellos = [a.hello.remote() for a in self.actors]

    def start(self) -> DeviceInfo:
        self.launch()
        if self._launch_error is not None:
            raise self._launch_error
        ray, n, opts = self.ray, len(self.actors), self._opts
        try:
            hellos = ray.get(self._hellos, timeout=STARTUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"--ray: {n} actor(s) did not start within {STARTUP_TIMEOUT_S:.0f} s "
                               f"(does the cluster have {n * opts['num_gpus']:g} free GPU(s) and "
                               f"{n * opts['num_cpus']} CPUs?)") from None
        except ray.exceptions.RayError as e:
            why = str(e).strip().splitlines()[-1]
            raise RuntimeError(f"--ray: an actor failed to start: {why}") from None
        for state, h in zip(self.states.values(), hellos, strict=True):
            gpu = f" gpu {h['gpus']}" if h["gpus"] else ""
            state.where = f"{h['host']}{gpu} pid {h['pid']}"
        self.device, self.versions = same_device(hellos, "--ray")
        return self.device

    def _new_actor(self, slot: int) -> Any:
        return self._actor_cls.remote(f"actor{slot}", self.jobs or 0)

    @property
    def batch(self) -> int:
        """Compile processes per actor; an actor holds ``AHEAD`` times as many tasks."""
        return max(1, self.jobs or 0)

    def capacity(self) -> int:
        return max(0, len(self.actors) * AHEAD * self.batch - len(self._tasks))

    def submit(self, key: Any, task: dict[str, Any], label: str = "") -> None:
        self._tasks[key] = (task, label)
        self._queue.append(key)
        self._dispatch()

    def _dispatch(self) -> None:
        """Top every actor up to ``AHEAD * batch`` tasks and keep one collect() in flight per busy actor."""
        busy, now = set(self._collecting.values()), time.monotonic()
        for slot, actor in enumerate(self.actors):
            pending = self._pending[slot]
            room = AHEAD * self.batch - len(pending)
            if room > 0 and self._queue:
                sent = []
                for _ in range(min(room, len(self._queue))):
                    key, tid = self._queue.popleft(), next(self._ids)
                    pending[tid] = key
                    sent.append((tid, self._tasks[key][0]))
                actor.add.remote(sent, self.timeout)  # ordered before the collect() below on this actor
            if pending and slot not in busy:
                ref = actor.collect.remote(COLLECT_WAIT_S)
                self._collecting[ref], self._asked[ref] = slot, now
            labels = [self._tasks[k][1] for k in pending.values()]
            more = f" +{len(labels) - 1}" if len(labels) > 1 else ""
            self.states[f"actor{slot}"].current = labels[0] + more if labels else None

    def poll(self, wait_s: float = 1.0) -> list[tuple[Any, dict[str, Any], str]]:
        ray = self.ray
        unavailable = tuple(getattr(ray.exceptions, n) for n in ("ActorUnavailableError",)
                             if hasattr(ray.exceptions, n))  # newer Rays: unreachable for now
        if not self._collecting:
            return []
        ready, _ = ray.wait(list(self._collecting), num_returns=1, timeout=wait_s)
        if ready:
            rest = [r for r in self._collecting if r not in ready]
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
        done = []
        # A healthy actor answers a collect() within COLLECT_WAIT_S plus, at worst, a worker's start-up and
        # a task's time limit; one unanswered for longer is stuck: lost, never waited on.
        limit = COLLECT_WAIT_S + STARTUP_TIMEOUT_S + 2 * self.timeout + 60
        for ref in [r for r in self._collecting if r not in ready]:
            if time.monotonic() - self._asked[ref] > limit:
                slot = self._collecting.pop(ref)
                self._asked.pop(ref)
                done += self._lost(slot, f"no reply within {limit:.0f} s")
        for ref in ready:
            slot = self._collecting.pop(ref)
            self._asked.pop(ref)
            name = f"actor{slot}"
            try:
                results = ray.get(ref)
            except (ray.exceptions.RayActorError, *unavailable) as e:  # the actor is gone (or unreachable)
                done += self._lost(slot, str(e).strip().splitlines()[0][:200])
                continue
            except ray.exceptions.RayTaskError as e:  # moetune's own code failed in the actor
                raise RuntimeError(f"--ray: {name} failed: {str(e).strip().splitlines()[-1]}") from None
            for tid, res in results:
                key = self._pending[slot].pop(tid)
                self._tasks.pop(key)
                self.states[name].counts[res["status"]] += 1
                done.append((key, res, name))
        self._dispatch()
        return done

    def _lost(self, slot: int, why: str) -> list[tuple[Any, dict[str, Any], str]]:
        """An actor died with tasks on it: a new one takes its place, its tasks go back to the front of
        the queue, except those that have now lost ``max_losses`` actors (recorded as crashes)."""
        name = f"actor{slot}"
        self.states[name].counts["lost"] += 1
        self.ray.kill(self.actors[slot])
        self.actors[slot] = self._new_actor(slot)
        keys = list(self._pending.pop(slot, {}).values())
        for key in keys:
            self.losses[key] += 1
        again = [k for k in keys if self.losses[k] < self.max_losses]
        self._queue.extendleft(reversed(again))  # unfinished work: to the next free actor, first
        out = []
        for key in keys:
            if key not in again:
                self._tasks.pop(key)
                out.append((key, {"status": "crash", "reason": f"lost {self.losses[key]} Ray actors "
                                                               f"measuring it ({why})"}, name))
        return out

    def close(self) -> None:
        ray = self.ray
        refs = [actor.close.remote() for actor in self.actors]  # stop the workers, remove the logs
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self._own_cluster:
            ray.shutdown()
