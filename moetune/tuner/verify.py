"""``moetune verify``: are the committed tables usable, and are they still right?

Static checks (``--schema-only``, what CI runs): the JSON Schema, the file's place (a file
whose name is not where the picker looks would silently never load), the kernel exists, its
shape normalizes, and every entry's config passes the kernel's constraints at that entry's
point. Without ``--schema-only``, on a device of the table's arch, each entry is also re-run
through the tuner's runner: the accuracy gate again, and its time against the shipped default
at the same point, flagging a config that is now slower than the default beyond noise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from moetune.device import INTERPRETER, DeviceInfo, device_info
from moetune.problem import Problem
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec
from moetune.tables import format as tables

# Opt-in shared memory per block by arch, for judging a table's configs on a machine without that GPU.
_ARCH_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448,
              "sm_100": 232448, "sm_103": 232448, "sm_120": 101376}
KNOWN_ARCHS = ("interpreter", *_ARCH_SMEM)


@dataclass(frozen=True)
class Finding:
    path: str
    field: str
    message: str
    level: str = "error"  # "error" fails verify; "warning" is reported only

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.message}"


def table_files(paths: Iterable[str | os.PathLike], *, require: bool = False) -> list[Path]:
    """Every ``*.json`` under the given directories, plus the files given; missing paths raise, and with
    ``require`` so does a directory that holds no table file (a typo'd path must not pass as checked)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.rglob("*.json") if q.is_file())
            if require and not found:
                raise FileNotFoundError(f"no table files (*.json) under {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no table file or directory at {p}")
    return out


def device_for_arch(arch: str, name: str | None = None) -> DeviceInfo:
    """This machine's device when it is of ``arch``, else a stand-in with that arch's limits."""
    if arch == "interpreter":
        return INTERPRETER
    current = device_info()
    if current.arch == arch:
        return current
    return DeviceInfo(name=name or arch, arch=arch, sm_count=132, max_shared_mem=_ARCH_SMEM.get(arch, 232448),
                      l2_bytes=50 * 2**20, is_gpu=False)


def entry_problem(spec: KernelSpec, shape: dict, entry: dict) -> Problem:
    """The point an entry was measured at (its own record, or one derived from its density)."""
    routes = entry.get("routes") or max(1, round(entry["density"] * shape["E"]))
    tokens = entry.get("tokens") or max(1, -(-routes // shape["top_k"]))
    return Problem(spec.name, shape, tokens, routes, entry.get("active_fraction", 1.0),
                   entry.get("routing", "uniform"))


def check_file(path: str | os.PathLike) -> tuple[dict | None, list[Finding]]:
    """The static checks of one file: (the table if it parsed, findings)."""
    path = Path(path)
    try:
        doc = tables.read(path)
    except tables.TableError as e:
        return None, [Finding(str(path), e.field, e.message)]
    found: list[Finding] = []

    def bad(fld: str, message: str, level: str = "error") -> None:
        found.append(Finding(str(path), fld, message, level))

    try:
        spec = get_spec(doc["kernel"])
    except ValueError as e:
        bad("kernel", str(e))
        return doc, found
    try:
        shape = spec.normalize_shape(doc["shape"])
    except ValueError as e:
        bad("shape", str(e))
        return doc, found
    if shape != doc["shape"]:
        bad("shape", f"not normalized: the kernel reads it as {shape}")
    _check_place(path, doc, shape, bad)
    try:
        spec.check_config(doc["default"])
    except ValueError as e:
        bad("default", str(e))
    if dict(doc["default"]) != dict(spec.default):
        bad("default", f"the kernel's shipped default is now {dict(spec.default)}; speedups in this "
                       "table are against the old one", "warning")
    device = device_for_arch(doc["arch"], doc["device"])
    for i, entry in enumerate(doc["entries"]):
        try:
            spec.check_config(entry["config"])
            why = spec.constraint(dict(entry["config"]), entry_problem(spec, shape, entry), device)
        except ValueError as e:
            why = str(e)
        if why:
            bad(f"entries[{i}].config", why)
        err = entry.get("error")
        if isinstance(err, (int, float)) and not spec.passes(err):  # recorded as measured, re-checked
            limit = "bit-exact" if spec.exact else f"tolerance {spec.tolerance:g}"
            bad(f"entries[{i}].error", f"{err:.3g} is over the kernel's {limit}: not an accurate config")
    return doc, found


def _check_place(path: Path, doc: dict, shape: dict, bad: Callable[[str, str], None]) -> None:
    """The picker finds a table only at ``<arch>/<kernel>/[<device>/]<shape>.json``."""
    want = tables.table_path(Path("."), doc["arch"], doc["kernel"], shape, device=doc["device"])
    have = path.resolve().parts[-len(want.parts):]
    if tuple(have) != want.parts:
        bad("(path)", f"the picker looks for this table at .../{want.as_posix()}; it is at {path}")


# (spec, problem, config) -> a result as the tuner's runner gives it: status, error, time_ms, spread, reason.
Measure = Callable[[KernelSpec, Problem, dict], dict]


class RunnerMeasure:
    """Measures through the tuner's runner (isolated worker, the sweep's accuracy gate and timing rules)."""

    def __init__(self, **runner_options):
        from moetune.tuner.backends.process import Runner

        self.runner = Runner(**runner_options)

    def __call__(self, spec: KernelSpec, problem: Problem, config: dict) -> dict:
        for _, res in self.runner.measure(spec, problem, [config]):
            return res
        return {"status": "crash", "reason": "the runner returned nothing"}

    def close(self) -> None:
        self.runner.close()


def recheck(path: str | os.PathLike, doc: dict, measure: Measure) -> list[Finding]:
    """Re-run each entry and the shipped default at the entry's point: the entry must still pass
    the accuracy check, and must not be slower than the default beyond both their noise bands."""
    spec = get_spec(doc["kernel"])
    shape = spec.normalize_shape(doc["shape"])
    default = dict(spec.default)
    found = []
    for i, entry in enumerate(doc["entries"]):
        problem = entry_problem(spec, shape, entry)
        res = measure(spec, problem, dict(entry["config"]))
        if res.get("status") != "ok":
            err = res.get("error")
            found.append(Finding(str(path), f"entries[{i}].config", f"{res.get('status')} on re-run"
                                 + (f" (error {err:.3g})" if isinstance(err, float) else "")
                                 + f": {res.get('reason') or ''}".rstrip(": ")))
            continue
        if dict(entry["config"]) == default:
            continue
        base = measure(spec, problem, default)
        if base.get("status") != "ok":
            continue  # nothing to compare against; the entry itself is fine
        t, s = res["time_ms"], res.get("spread") or 0.0
        td, sd = base["time_ms"], base.get("spread") or 0.0
        if t * (1 - s / 2) > td * (1 + sd / 2):
            found.append(Finding(str(path), f"entries[{i}].time_ms", f"slower than the default now: "
                                 f"{t:.4g} ms vs {td:.4g} ms (spreads {s:.1%}, {sd:.1%})"))
    return found


def verify(paths: Iterable[str | os.PathLike], *, schema_only: bool = True,
           measure: Measure | None = None, require: bool = False) -> tuple[list[Path], list[Finding]]:
    """Check every table under ``paths``; re-run entries too unless ``schema_only``.

    Re-running uses ``measure``, else the tuner's runner on this machine, for tables of this
    machine's arch (the interpreter's on a CPU); tables of other archs get a warning. ``require``:
    a directory without tables is a FileNotFoundError (see :func:`table_files`).
    """
    files = table_files(paths, require=require)
    findings: list[Finding] = []
    here = device_info()
    own: RunnerMeasure | None = None
    try:
        for f in files:
            doc, found = check_file(f)
            findings += found
            if schema_only or doc is None or any(x.level == "error" for x in found):
                continue
            if measure is None and here.arch != doc["arch"]:
                findings.append(Finding(str(f), "(re-run)", f"not re-run: needs a {doc['arch']} device, "
                                        f"this machine has {here.name} ({here.arch})", "warning"))
                continue
            if measure is None:
                own = own or RunnerMeasure()
            findings += recheck(f, doc, measure or own)
    finally:
        if own is not None:
            own.close()
    return files, findings
