"""``moetune export``: the best accurate config per (device, shape, density) from the results store,
merged into the lookup tables under ``configs/``.

How a density's config is chosen (docs/tables.md has the long form):

* Rows are grouped by (kernel, device name, shape); all GPUs that report the same device name
  are one device. Repeated measurements of a config at a point merge: the fastest of their
  medians (interference only slows a run), with the steadiest one's spread.
* A config that was ever ``inaccurate`` for this (kernel, device, shape) is never exported.
* Points (tokens, routes, active fraction, routing) with the same density form one entry,
  decided at its typical point (uniform routing, then the largest active fraction, then the
  fewest tokens): each config measured there scores its time over the default's time there (the
  best time there when the default is missing); its noise band is +- half its relative spread.
* The lowest score wins; configs whose bands overlap the winner's are ties, broken by the lower
  spread (a band is never wider than +-5%: a wider spread is a disturbed reading). When the
  default's band overlaps the winner's, the entry keeps the default.
* Except where two or more sweeps each measured many configs at the typical point
  (:data:`CROSS_RUN_ROWS`): runs on different cards or days rank configs differently by more than
  the margins above, and the fastest reading would follow whichever run measured fastest. There each
  shared config scores its worst time over the sweeps, each over that sweep's own best, and the
  lowest worst wins: a config robust across the runs.
* Every device gets its own table; the arch table is filled from one device per shape (the one
  with the most accurate measurements there, or ``arch_device``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune.problem import canonical_json
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec
from moetune.tables import format as tables
from moetune.tables import picker


@dataclass
class FileResult:
    path: Path
    changes: list[tables.Change]


@dataclass
class ExportResult:
    files: list[FileResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "file: field: message", one per bad value
    notes: list[str] = field(default_factory=list)  # nothing wrong, nothing written (e.g. all rejected)


@dataclass
class _Point:
    """One config's merged measurements at one point."""

    time_ms: float
    spread: float
    error: float
    roofline_frac: float | None
    timestamp: str
    triton: str | None


def _sig(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else float(f"{x:.{digits}g}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _opt(value: Any) -> Any:
    """pandas NaN/None -> None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


class _Rows:
    """Store rows checked field by field; bad ones become problems naming the row and field."""

    def __init__(self, db: Path):
        self.db = db
        self.problems: dict[tuple[str, str], list[int]] = defaultdict(list)

    def bad(self, row_id: int, fld: str, message: str) -> None:
        self.problems[(fld, message)].append(row_id)

    def messages(self) -> list[str]:
        out = []
        for (fld, message), ids in sorted(self.problems.items()):
            shown = ", ".join(map(str, ids[:5])) + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else "")
            out.append(f"{self.db}: row{'s' if len(ids) > 1 else ''} {shown}: field {fld}: {message}")
        return out

    def check(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        rid = int(row["id"])
        try:
            spec = get_spec(row["kernel"])
        except ValueError as e:
            return self.bad(rid, "kernel", str(e))
        try:
            tables.check_device_name(row["device_name"], "device_name")
        except ValueError as e:
            return self.bad(rid, "device_name", str(e))
        try:
            tables.check_arch(row["arch"])
        except ValueError as e:
            return self.bad(rid, "arch", str(e))
        try:
            shape = spec.normalize_shape(json.loads(row["shape"]))
        except (TypeError, ValueError) as e:
            return self.bad(rid, "shape", str(e))
        try:
            config = json.loads(row["config"])
            if not isinstance(config, dict):
                raise ValueError(f"a config is a JSON object, got {row['config']!r}")
            if row["status"] == "ok":
                spec.check_config(config)
        except (TypeError, ValueError) as e:
            return self.bad(rid, "config", str(e))
        # A key the row predates counts as the default's value (the sweep's resume rule), so old and
        # new rows of one config pool, and the default is recognised in either form; configs that
        # build the same kernel pool under the spec's canonical one.
        out = dict(row, spec=spec, shape=shape, config=spec.canonical({**spec.default, **config}))
        if row["status"] != "ok":
            return out
        for col in ("time_ms", "routes", "tokens"):
            if not _finite(row[col]) or row[col] <= 0:
                return self.bad(rid, col, f"an ok row needs a positive finite {col}, got {row[col]!r}")
        if not _finite(row["error"]) or row["error"] < 0:
            return self.bad(rid, "error", f"must be finite and >= 0, got {row['error']!r}")
        if not spec.passes(row["error"]):  # the status is only what the row says (stores can be edited)
            limit = "bit-exact" if spec.exact else f"tolerance {spec.tolerance:g}"
            return self.bad(rid, "error", f"an ok row's error must be within the kernel's {limit}, "
                                          f"got {row['error']!r}")
        min_ms = _opt(row["min_ms"])
        if min_ms is not None and (not _finite(min_ms) or min_ms <= 0):
            return self.bad(rid, "min_ms", f"must be positive and finite, got {min_ms!r}")
        af = row["active_fraction"]
        if not _finite(af) or not 0 < af <= 1:
            return self.bad(rid, "active_fraction", f"must be in (0, 1], got {af!r}")
        for col in ("spread", "roofline_frac"):
            value = _opt(row[col])
            if value is not None and (not _finite(value) or value < 0):
                return self.bad(rid, col, f"must be finite and >= 0, got {value!r}")
        return out


def _merge_repeats(rows: list[dict]) -> _Point:
    """Repeats of one config at one point (re-measurements, pooled stores). Each is already a median
    of many runs, and interference on a shared GPU only ever slows a run, so the fastest repeat is the
    config's time and the steadiest repeat's spread its noise: neither slow readings nor one wild
    spread may decide an entry (see docs/tuner.md, "Export: repeats")."""
    times = sorted(r["time_ms"] for r in rows)
    mid = times[0]
    spread = min(_opt(r["spread"]) or 0.0 for r in rows)
    fracs = [_opt(r["roofline_frac"]) for r in rows if _opt(r["roofline_frac"]) is not None]
    latest = max(rows, key=lambda r: r["timestamp"] or "")
    return _Point(mid, spread, max(r["error"] for r in rows), max(fracs) if fracs else None,
                  latest["timestamp"] or "", _opt(latest["triton_version"]))


# Widest relative spread a noise band takes: a wider one is a disturbed reading, not a wider truth, and
# uncapped it ties a noisy config with much slower steady ones (see docs/tuner.md, "Export: ties").
TIE_SPREAD_CAP = 0.1


def _choose(spec: KernelSpec, points: dict[tuple, dict[str, _Point]], banned: set[str],
            raw: dict[tuple, dict[str, list[dict]]] | None = None) -> tuple[str, int]:
    """The config key for one density and how many points its score covers (1: its typical point).
    ``raw``: the rows behind ``points``, for the cross-run rule."""
    default = canonical_json(dict(spec.default))
    # Decided at the density's typical point, the one the entry reports. The other points at this density
    # (skewed routing, part of the routes active) were searched apart, each with a budget of its own, so
    # a config's mean over the points it happened to be measured at compares configs over different
    # points, and picks slower configs at the typical one (see docs/tuner.md, "Export: typical point").
    measured = points[_typical(points)]
    if not set(measured) - banned:  # nothing accurate there: the next most typical point decides
        rest = {pt: m for pt, m in points.items() if set(m) - banned}
        if not rest:
            return "", 0
        measured = rest[_typical(rest)]
    typical = next(pt for pt, m in points.items() if m is measured)
    robust = _cross_run(raw[typical], banned) if raw else None
    if robust is not None:
        return robust, 1
    ref = measured[default].time_ms if default in measured else min(p.time_ms for p in measured.values())
    scores: dict[str, tuple[float, float, int]] = {  # config -> (time / default's, spread, points)
        cfg: (p.time_ms / ref, p.spread, 1) for cfg, p in measured.items() if cfg not in banned}
    if not scores:
        return "", 0

    def band(cfg: str) -> tuple[float, float]:
        s, sp, _ = scores[cfg]
        sp = min(sp, TIE_SPREAD_CAP)
        return s * (1 - sp / 2), s * (1 + sp / 2)

    def tie(a: str, b: str) -> bool:
        (lo_a, hi_a), (lo_b, hi_b) = band(a), band(b)
        return lo_a <= hi_b and lo_b <= hi_a

    best = min(scores, key=lambda c: (scores[c][0], c))
    if default in scores and tie(best, default):
        return default, scores[default][2]
    tied = [c for c in scores if tie(c, best)]
    chosen = min(tied, key=lambda c: (scores[c][1], scores[c][0], c))
    return chosen, scores[chosen][2]


# Ok rows (configs) an exhaustive sweep needs at a point to take part in the cross-run rule, so that the
# configs the sweeps share include every contender. One run's best can be several percent off in
# another run; the config with the lowest worst ratio is close in all (see docs/tuner.md, "Export:
# cross-run rule").
CROSS_RUN_ROWS = 200


def _cross_run(raw: dict[str, list[dict]], banned: set[str]) -> str | None:
    """The config with the lowest worst (time / its sweep's best) over the exhaustive sweeps that each
    measured at least CROSS_RUN_ROWS configs at this point, among the configs they all measured; None
    where fewer than two sweeps qualify. Only exhaustive sweeps vote: a whole space measured by one
    code version on one card. (The reference dataset's "exhaustive-slice" rows, measured on older
    kernels, would otherwise outvote today's: its K-split rows include a sum launch the kernels no
    longer run.)"""
    per_sweep: dict[str, dict[str, float]] = defaultdict(dict)
    for cfg, rows in raw.items():
        if cfg in banned:
            continue
        for r in rows:
            if r.get("strategy") != "exhaustive":
                continue
            mine = per_sweep[r.get("sweep_id")]
            mine[cfg] = min(mine.get(cfg, math.inf), r["time_ms"])
    broad = [t for t in per_sweep.values() if len(t) >= CROSS_RUN_ROWS]
    if len(broad) < 2:
        return None
    shared = set.intersection(*(set(t) for t in broad))
    if not shared:
        return None
    bests = [min(t[c] for c in shared) for t in broad]
    return min(shared, key=lambda c: (max(t[c] / b for t, b in zip(broad, bests, strict=True)), c))


def _typical(points: Iterable[tuple]) -> tuple:
    """The most typical of a density's points (tokens, routes, active fraction, routing): uniform
    routing first, then the largest active fraction, then the fewest tokens."""
    return min(points, key=lambda pt: (pt[3] != "uniform", -pt[2], pt[0], pt[3]))


def _entry(cfg: str, default: str, points: dict[tuple, dict[str, _Point]], n: int, device: str) -> dict:
    """The table entry for ``cfg``, reporting its times at its most typical point."""
    mine = [pt for pt in points if cfg in points[pt]]
    rep = _typical(mine)
    tokens, routes, af, routing = rep
    p = points[rep][cfg]
    base = points[rep].get(default)
    return {
        "density": None,  # filled by the caller (the group's key)
        "config": json.loads(cfg),
        "time_ms": _sig(p.time_ms),
        "default_ms": _sig(base.time_ms) if base else None,
        "speedup": _sig(base.time_ms / p.time_ms, 4) if base else None,
        "spread": _sig(p.spread, 4),
        "error": _sig(max(points[pt][cfg].error for pt in mine), 4),
        "roofline_frac": _sig(p.roofline_frac, 4),
        "tokens": int(tokens), "routes": int(routes), "active_fraction": float(af), "routing": routing,
        "points": n, "device": device, "triton": p.triton, "date": p.timestamp[:10] or None,
    }


def _fix_speedup(entry: dict) -> dict:
    """Speedup from the rounded times, so the file is self-consistent."""
    if entry["default_ms"] is not None:
        entry["speedup"] = _sig(entry["default_ms"] / entry["time_ms"], 4)
    if entry["date"] is None:
        del entry["date"]
    return entry


def _device_table(spec: KernelSpec, device: str, arch: str, shape: dict, rows: list[dict]) -> dict:
    default = canonical_json(dict(spec.default))
    banned = {r["config_key"] for r in rows if r["status"] == "inaccurate"}
    by_density: dict[float, dict[tuple, dict[str, list[dict]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if r["status"] == "ok":
            pt = point_key(r)
            by_density[tables.density_key(r["routes"] / shape["E"])][pt][r["config_key"]].append(r)
    entries = []
    for dkey in sorted(by_density):
        points = {pt: {c: _merge_repeats(rs) for c, rs in m.items()} for pt, m in by_density[dkey].items()}
        cfg, n = _choose(spec, points, banned, by_density[dkey])
        if cfg:
            entry = _entry(cfg, default, points, n, device)
            entry["density"] = dkey
            entries.append(_fix_speedup(entry))
    rejected: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["status"] != "ok":
            rejected[r["status"]] += 1
    latest = max(rows, key=lambda r: r["timestamp"] or "")
    return {
        "format": tables.FORMAT, "version": tables.VERSION, "kernel": spec.name, "arch": arch,
        "device": device, "device_names": [device], "shape": shape, "default": dict(spec.default),
        "strategy": sorted({r["strategy"] for r in rows if _opt(r["strategy"])}),
        "candidates": {"measured": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
                       "rejected": dict(sorted(rejected.items()))},
        "versions": {"moetune": _opt(latest["moetune_version"]), "triton": _opt(latest["triton_version"]),
                     "torch": _opt(latest["torch_version"]), "cuda": _opt(latest["cuda_version"])},
        "date": (latest["timestamp"] or "")[:10] or _today(),
        "entries": entries,
    }


def _today() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def _arch_table(device_tables: list[dict], arch_device: str | None) -> dict | None:
    """The arch table for one shape: a copy of one device's table (``arch_device`` if it measured
    this shape, else the device with the most accurate measurements, ties by name)."""
    pool = [t for t in device_tables if arch_device is None or t["device"] == arch_device]
    if not pool:
        return None
    src = min(pool, key=lambda t: (-t["candidates"]["ok"], t["device"]))
    return dict(src, device=None)


def _write(path: Path, doc: dict, result: ExportResult) -> None:
    old = None
    if path.exists():
        try:
            old = tables.read(path)
        except tables.TableError as e:
            result.problems.append(f"{e} (not overwritten; fix or delete it and export again)")
            return
    try:
        merged, changes = tables.merge(old, doc, path)
        tables.write(path, merged)
    except (tables.TableError, OSError) as e:
        result.problems.append(str(e))
        return
    result.files.append(FileResult(path, changes))


def current_launch_rows(spec: KernelSpec, arch: str, rows: list[dict]) -> list[dict]:
    """The rows that rank each point: at a point with rows of the spec's current launch contract
    (:meth:`KernelSpec.launch_contract`), those only; elsewhere the rows that record no contract
    (stores from before it was recorded). Rows of another contract never rank."""
    want = spec.launch_contract(arch)
    if want is None:
        return rows
    current = {point_key(r) for r in rows if r.get("launch") == want}
    return [r for r in rows if r.get("launch") == want
            or (not _opt(r.get("launch")) and point_key(r) not in current)]


def point_key(row: Mapping[str, Any]) -> tuple[int, int, float, str]:
    """A row's point: (tokens, routes, active fraction, routing)."""
    return int(row["tokens"]), int(row["routes"]), float(row["active_fraction"]), row["routing"]


def export(db: str | Path | Sequence[str | Path], out: str | Path = picker.PACKAGED, *,
           kernels: Iterable[str] = (), device: str | None = None, arch_device: str | None = None,
           on_progress: Callable[[int, int, str], None] | None = None) -> ExportResult:
    """Write the best configs of one store, or of several pooled (e.g. a new sweep's beside an older
    one's), into tables under ``out``; bad rows are reported, not exported. A store may also be given
    as its CSV/Parquet export (``moetune results --csv``), the compact form kept in the repository.
    ``on_progress(done, total, label)``: before each (kernel, shape, device) table and after the last."""
    from moetune.tuner.problems import resolve_kernels
    from moetune.tuner.store import read_frame

    dbs = [Path(d) for d in ([db] if isinstance(db, (str, Path)) else db)]
    out = Path(out)
    # a family name ("fp4_prefill") means all its ops; an unknown name is a ValueError naming it
    kernels = [s.name for s in resolve_kernels(list(kernels))] if kernels else []
    if device is not None:
        tables.check_device_name(device, "--device")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    problems: list[str] = []
    for path in dbs:
        frame = read_frame(path, "--db")
        if device is not None:
            frame = frame[frame["device_name"] == device]
        if kernels:
            frame = frame[frame["kernel"].isin(kernels)]
        checker = _Rows(path)
        for row in frame.to_dict("records"):
            r = checker.check(row)
            if r is None:
                continue
            r["config_key"] = canonical_json(r["config"])
            groups[(r["kernel"], r["arch"], canonical_json(r["shape"]), r["device_name"])].append(r)
        problems += checker.messages()
    result = ExportResult(problems=problems)
    by_arch: dict[tuple, list[dict]] = defaultdict(list)
    for i, ((kernel, arch, _, dev), rows) in enumerate(sorted(groups.items())):
        if on_progress is not None:
            on_progress(i, len(groups), f"{kernel} {tables.shape_stem(rows[0]['shape'])} on {dev}")
        spec, shape = rows[0]["spec"], rows[0]["shape"]
        rows = current_launch_rows(spec, arch, rows)
        doc = _device_table(spec, dev, arch, shape, rows) if rows else {"shape": shape, "entries": []}
        if not doc["entries"]:
            result.notes.append(f"{kernel} {tables.shape_stem(doc['shape'])} on {dev}: "
                                "no accurate measurement to export")
            continue
        _write(tables.table_path(out, arch, kernel, doc["shape"], device=dev), doc, result)
        by_arch[(kernel, arch, tables.shape_stem(doc["shape"]))].append(doc)
    for (kernel, arch, _), docs in sorted(by_arch.items()):
        doc = _arch_table(docs, arch_device)
        if doc is not None:
            _write(tables.table_path(out, arch, kernel, doc["shape"]), doc, result)
    if on_progress is not None:
        on_progress(len(groups), len(groups), "")
    picker.clear_cache()  # this process's picker must not answer from the tables it read before
    return result

