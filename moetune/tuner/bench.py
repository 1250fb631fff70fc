"""Default vs heuristic vs tuned table, side by side at each point, timed the way the sweep times.

For each problem three configs are compared: the spec's shipped default, its
heuristic (the picker's fallback) and the picker's answer (a table entry, or the
heuristic where no table covers the point). Each goes through the tuner's
:class:`~moetune.tuner.backends.process.Runner` (accuracy check against the reference first, then
CUDA-graph replays or L2-flushed event timing, as in a sweep), so a bench number
and a sweep number for the same config mean the same thing. Configs that are
equal once the default fills missing keys are measured once and reported for
each role. With ``repeat > 1`` every config is measured that many times, in a
rotated order, and the median of the rounds is kept.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.device import DeviceInfo
from moetune.problem import Config, Problem, canonical_json
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec
from moetune.tuner.backends.base import SequentialBackend
from moetune.tuner.backends.process import Runner

INTERPRETER_NOTE = "Interpreter mode (no GPU): the times are wall clock of a CPU emulation and mean nothing."
KERNEL_ONLY_NOTE = ("Kernel only: the fp8 GEMMs' route alignment and activation split were made before the "
                    "timed runs (shared or fused in the layer); the tuner times the whole op. The fp4 GEMMs "
                    "and the gather are always timed so.")
ROLES = ("default", "heuristic", "tuned")
# Columns of a bench frame (and of its CSV / Markdown), in order.
COLUMNS = (
    "kernel", "shape", "tokens", "routes", "active_fraction", "routing", "density", "device", "arch",
    *(f"{role}_{what}" for role in ROLES
      for what in ("config", "status", "reason", "error", "ms", "spread", "roofline")),
    "heuristic_speedup", "tuned_speedup", "tuned_source",
)


@dataclass
class Measured:
    """One config's result at one problem, over all rounds: the median time; the spread is the timing's
    own (p80 - p20) / median for one round, else the rounds' (max - min) / median."""

    status: str
    reason: str | None = None
    error: float | None = None
    time_ms: float | None = None
    spread: float | None = None
    roofline: float | None = None

    @classmethod
    def from_rounds(cls, results: Sequence[Mapping[str, Any]]) -> Measured:
        bad = [r for r in results if r.get("status") != "ok"]
        if bad:  # a config that failed any round is reported by its first failure
            r = bad[0]
            return cls(r.get("status", "crash"), r.get("reason"), r.get("error"))
        times = [r["time_ms"] for r in results]
        fracs = [r["roofline_frac"] for r in results if r.get("roofline_frac") is not None]
        spread = (max(r.get("spread") or 0.0 for r in results) if len(results) == 1
                  else (max(times) - min(times)) / statistics.median(times))
        return cls("ok", results[0].get("reason"), max(r.get("error") or 0.0 for r in results),
                   statistics.median(times), spread, statistics.median(fracs) if fracs else None)


@dataclass
class BenchResult:
    """Rows (one dict per problem, keys :data:`COLUMNS`) plus what a reader must know about them."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    device: DeviceInfo | None = None
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kernel_only: bool = False  # timed with TimingOptions.kernel_only

    @property
    def meaningful(self) -> bool:
        """False on the Triton interpreter: wall-clock times of a CPU emulation say nothing."""
        return bool(self.device and self.device.is_gpu)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    def write_csv(self, path: str | Path) -> Path:
        path = _writable(path, "--csv")
        self.frame().to_csv(path, index=False)
        return path

    def write_markdown(self, path: str | Path) -> Path:
        """A readable table (times, speedups, roofline, statuses) under a line naming device and versions."""
        path = _writable(path, "--markdown")
        df = self.frame()
        view = df[["kernel", "shape", "tokens", "routes", "active_fraction", "routing", "density"]].copy()
        view["shape"] = view["shape"].map(shape_text)
        for role in ROLES:
            view[f"{role} ms"] = df[f"{role}_ms"].map(lambda v: _fmt(v, ".4g"))
            if role != "default":
                view[f"{role} x"] = df[f"{role}_speedup"].map(lambda v: _fmt(v, ".2f"))
        for role in ROLES:
            view[f"{role} roofline"] = df[f"{role}_roofline"].map(lambda v: _fmt(v, ".2f"))
        view["accuracy"] = [accuracy_text(r) for r in self.rows]
        view["tuned source"] = df["tuned_source"]
        d = self.device
        head = f"Device: {d.name} ({d.arch})" if d else "Device: unknown"
        versions = [f"{k.removesuffix('_version')} {v}" for k, v in sorted(self.versions.items()) if v]
        if versions:
            head += "; " + ", ".join(versions)
        if not self.meaningful:
            head += "\n\n" + INTERPRETER_NOTE
        if self.kernel_only:
            head += "\n\n" + KERNEL_ONLY_NOTE
        path.write_text(f"{head}\n\n{markdown_table(view)}\n")
        return path


def markdown_table(df) -> str:
    """A GitHub pipe table of a frame's cells as text (pandas' own needs tabulate)."""
    def cell(v: Any) -> str:
        return "-" if v is None or v != v else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in rec) + " |" for rec in df.itertuples(index=False)]
    return "\n".join(lines)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or v != v else format(v, spec)


def _writable(path: str | Path, option: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file path")
    if not path.parent.exists():
        raise ValueError(f"{option} {path}: directory {path.parent} does not exist")
    return path


def shape_text(shape: str | Mapping[str, Any]) -> str:
    """Canonical shape JSON or dict -> the table file stem, e.g. ``E256_N512_K7168_topk8_bfloat16``."""
    from moetune.tables.format import shape_stem

    return shape_stem(json.loads(shape) if isinstance(shape, str) else shape)


def accuracy_text(row: Mapping[str, Any]) -> str:
    """"ok" when every role passed its accuracy check, else each failing role and why."""
    bad = [f"{role}: {row[f'{role}_status']}" for role in ROLES if row[f"{role}_status"] != "ok"]
    return "ok" if not bad else "; ".join(bad)


def source_text(pick: Any) -> str:
    """Where the tuned config came from: the table file and the density entry used, or "heuristic"."""
    if pick.source == "heuristic" or pick.path is None:
        return "heuristic"
    path = Path(pick.path)
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return f"{path} @ density {pick.density_key:g}"


def role_configs(spec: KernelSpec, problem: Problem, device: DeviceInfo) -> tuple[dict[str, Config], Any]:
    """The default, heuristic and tuned configs (default values filled in), and the picker's answer."""
    from moetune.tables.picker import pick_config_with_source

    pick = pick_config_with_source(spec.name, dict(problem.shape), problem.routes, device=device)
    raw = {"default": spec.default, "heuristic": spec.heuristic(problem.shape, problem.routes, device.arch),
           "tuned": pick.config}
    return {role: {**spec.default, **dict(cfg)} for role, cfg in raw.items()}, pick


def bench_problems(problems: Sequence[Problem], runner: SequentialBackend, *, repeat: int = 1,
                   seed: int = 0, on_row: Callable[[dict[str, Any]], None] | None = None,
                   on_progress: Callable[[int, int, str], None] | None = None) -> BenchResult:
    """Measure the three roles at every problem on a started-or-not ``runner``; rows in problem order.
    ``on_progress(done, total, label)``: before each problem and after the last."""
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    device = runner.device or runner.start()
    result = BenchResult(device=device, versions=dict(runner.versions),
                         kernel_only=bool(runner.timing.get("kernel_only")))
    for i, problem in enumerate(problems):
        if on_progress is not None:
            on_progress(i, len(problems), point_text(problem))
        spec = get_spec(problem.kernel)
        configs, pick = role_configs(spec, problem, device)
        unique = {canonical_json(c): c for c in configs.values()}
        keys = list(unique)
        rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in keys}
        for r in range(repeat):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for cfg, res in runner.measure(spec, problem, [unique[k] for k in order], seed):
                rounds[canonical_json(cfg)].append(res)
        measured = {k: Measured.from_rounds(v) for k, v in rounds.items()}
        row = _row(problem, device, configs, measured, source_text(pick))
        result.rows.append(row)
        if on_row is not None:
            on_row(row)
    if on_progress is not None:
        on_progress(len(problems), len(problems), "")
    return result


def point_text(problem: Problem) -> str:
    """``fp8_decode.gate_up t16 r32`` (active fraction and routing where not 1 and uniform)."""
    text = f"{problem.kernel} t{problem.tokens} r{problem.routes}"
    if problem.active_fraction != 1:
        text += f" a{problem.active_fraction:g}"
    return text if problem.routing == "uniform" else f"{text} {problem.routing}"


def _row(problem: Problem, device: DeviceInfo, configs: Mapping[str, Config],
         measured: Mapping[str, Measured], source: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kernel": problem.kernel, "shape": problem.shape_key, "tokens": problem.tokens,
        "routes": problem.routes, "active_fraction": problem.active_fraction, "routing": problem.routing,
        "density": problem.density, "device": device.name, "arch": device.arch, "tuned_source": source,
    }
    for role, cfg in configs.items():
        m = measured[canonical_json(cfg)]
        row.update({f"{role}_config": canonical_json(cfg), f"{role}_status": m.status,
                    f"{role}_reason": m.reason, f"{role}_error": m.error, f"{role}_ms": m.time_ms,
                    f"{role}_spread": m.spread, f"{role}_roofline": m.roofline})
    base = measured[canonical_json(configs["default"])]
    for role in ("heuristic", "tuned"):
        m = measured[canonical_json(configs[role])]
        ok = base.status == "ok" and m.status == "ok" and m.time_ms
        row[f"{role}_speedup"] = base.time_ms / m.time_ms if ok else None
    return {c: row.get(c) for c in COLUMNS}


def bench(kernels: Sequence[str] = (), *, model: str | None = None, tp: int = 1, ep: int = 1,
          shape: str | dict | None = None, tokens: Sequence[int] = (), routes: Sequence[int] = (),
          active: Sequence[float] = (), routing: Sequence[str] = ("uniform",), repeat: int = 1,
          seed: int = 0, timeout: float = 60.0, timing: dict[str, Any] | None = None,
          on_row: Callable[[dict[str, Any]], None] | None = None,
          on_progress: Callable[[int, int, str], None] | None = None) -> BenchResult:
    """Plan the problems (as ``moetune sweep`` does) and bench them; the Python face of ``moetune bench``.

    Decode ops default to active fraction 1 here (a sweep also tunes 1/2 and 1/4).
    """
    plan, device = plan_bench(kernels, model=model, tp=tp, ep=ep, shape=shape, tokens=tokens, routes=routes,
                              active=active, routing=routing, repeat=repeat)
    with Runner(timeout=timeout, jobs=bench_jobs(device), timing=timing) as runner:
        result = bench_problems(plan.problems, runner, repeat=repeat, seed=seed, on_row=on_row,
                                on_progress=on_progress)
    result.notes = plan.notes + result.notes
    return result


def plan_bench(kernels: Sequence[str] = (), *, model: str | None = None, tp: int = 1, ep: int = 1,
               shape: str | dict | None = None, tokens: Sequence[int] = (), routes: Sequence[int] = (),
               active: Sequence[float] = (), routing: Sequence[str] = ("uniform",), repeat: int = 1):
    """(plan, device): every bad value fails here, before a worker starts."""
    from moetune.device import device_info
    from moetune.tuner.problems import build_plan

    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    device = device_info()
    if not active and not routes:
        active = (1.0,)
    plan = build_plan(kernels, model=model, tp=tp, ep=ep, shape=shape, tokens=tokens, routes=routes,
                      active=active, routing=routing, device=device)
    return plan, device


def bench_jobs(device: DeviceInfo) -> int:
    """Compile processes: at most three configs per point, so three; none on the interpreter."""
    return min(3, os.cpu_count() or 1) if device.is_gpu else 0
