"""What ``moetune sweep`` measures with: a backend and the driver that feeds it, from its options."""

from __future__ import annotations

from typing import Any

from moetune.tuner.backends.base import Backend
from moetune.tuner.backends.local import LocalBackend, gpu_count, parse_gpus
from moetune.tuner.backends.process import Runner
from moetune.tuner.backends.ray import RayBackend
from moetune.tuner.parallel import ParallelSweep
from moetune.tuner.sweep import Sweep


def make_runner(*, gpus: str | None = None, ray: bool = False, ray_address: str | None = None,
                ray_actors: int | None = None, ray_gpus_per_actor: float = 1.0, timeout: float = 60.0,
                jobs: int | None = None, timing: dict[str, Any] | None = None) -> tuple[Backend, type[Sweep]]:
    """The measurement backend and the sweep driver (constructed as ``driver(store, backend, ...)``).

    ``--gpus`` puts one measuring worker on each GPU it names, one or several, and searches every
    point at once (:class:`ParallelSweep`), so compiles for some points overlap measuring others; no
    option does that on GPU 0 (faster than one point at a time, see docs/tuner.md, "Parallel sweeps").
    ``--ray`` does it on Ray actors. Without a GPU (the interpreter) it is the plain :class:`Runner`
    and :class:`Sweep`, one point at a time.
    """
    if gpus is not None and ray:
        raise ValueError("--gpus and --ray exclude each other (Ray places its actors on GPUs itself)")
    if not ray and (ray_address is not None or ray_actors is not None or ray_gpus_per_actor != 1.0):
        raise ValueError("--ray-address, --ray-actors and --ray-gpus-per-actor need --ray")
    if ray:
        return RayBackend(address=ray_address, actors=ray_actors, gpus_per_actor=ray_gpus_per_actor,
                          timeout=timeout, jobs=jobs, timing=timing), ParallelSweep
    if gpus is None:
        if gpu_count() < 1:
            return Runner(timeout=timeout, jobs=jobs, timing=timing), Sweep
        gpus = "0"
    backend = LocalBackend(parse_gpus(gpus, gpu_count()), timeout=timeout, jobs=jobs, timing=timing)
    return backend, ParallelSweep
