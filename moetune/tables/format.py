"""Lookup tables on disk: where they live, how they are read, checked, merged and written.

One JSON file per (arch, kernel op, shape), optionally per device:

    configs/<arch>/<kernel>/<shape>.json            the arch table
    configs/<arch>/<kernel>/<device>/<shape>.json   the table for one device name

``<shape>`` comes from the op's normalized shape (:func:`shape_stem`), ``<device>``
from the device name (:func:`device_dir`). Reading is JSON only (no code runs),
strict (NaN and Infinity are refused) and validated against the packaged JSON
Schema plus checks a schema cannot express; every failure is a :class:`TableError`
that names the file and the field. Writing keeps a stable key order with one
entry per line, so a re-export diffs as the entries that changed. docs/tables.md
describes the format.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "moetune-table"
VERSION = 1
SCHEMA_PATH = Path(__file__).parent / "schema" / "table.schema.json"

TOP_KEYS = ("format", "version", "kernel", "arch", "device", "device_names", "shape", "default",
            "strategy", "candidates", "versions", "date", "entries")
ENTRY_KEYS = ("density", "config", "time_ms", "default_ms", "speedup", "spread", "error", "roofline_frac",
              "tokens", "routes", "active_fraction", "routing", "points", "device", "triton", "date")
# A table is a few KB (the largest shipped one is about 22 KB); anything far larger is refused before it
# is parsed, so a hostile or runaway file cannot stall the first pick of a process.
MAX_TABLE_BYTES = 1 << 20
MAX_ENTRIES = 4096
_CORE_SHAPE = (("E", "E"), ("N", "N"), ("K", "K"), ("top_k", "topk"))
_NAME_RE = re.compile(r"^[a-z0-9_]+$")
_KERNEL_RE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")


class TableError(ValueError):
    """A table (or store row) that cannot be used; says which file and which field."""

    def __init__(self, path: str | os.PathLike, field: str, message: str):
        self.path, self.field, self.message = str(path), field, message
        super().__init__(f"{self.path}: {field}: {message}")


# ---- names and locations ----------------------------------------------------------------------
def check_device_name(name: Any, field: str = "device") -> str:
    """A device name as the store and tables record it; ValueError for names that could escape a path."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{field}: device name must be a non-empty string, got {name!r}")
    if "/" in name or "\\" in name or ".." in name or "\x00" in name:
        raise ValueError(f"{field}: device name {name!r} contains a path separator or '..'")
    return name


def device_dir(name: str) -> str:
    """Directory of a device's tables: the name lowercased, runs of other characters as '_'
    ("NVIDIA H200" -> "nvidia_h200")."""
    check_device_name(name)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if not slug:
        raise ValueError(f"device: device name {name!r} has no letters or digits")
    return slug


def check_arch(arch: Any) -> str:
    if not isinstance(arch, str) or not _NAME_RE.match(arch):
        raise ValueError(f"arch: must look like 'sm_90' (lowercase letters, digits, '_'), got {arch!r}")
    return arch


def check_kernel_name(kernel: Any) -> str:
    if not isinstance(kernel, str) or not _KERNEL_RE.match(kernel):
        raise ValueError(f"kernel: must look like 'fp8_decode.gate_up', got {kernel!r}")
    return kernel


def _token(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "-"


def shape_stem(shape: Mapping[str, Any]) -> str:
    """File stem of a normalized shape: ``E256_N512_K7168_topk8`` then the op's other fields in
    key order, a string as its value (``bfloat16``), anything else as key and value (``limit7.0``)."""
    parts = [f"{tag}{int(shape[key])}" for key, tag in _CORE_SHAPE]
    for key in sorted(set(shape) - {k for k, _ in _CORE_SHAPE}):
        value = shape[key]
        parts.append(_token(value) if isinstance(value, str) else f"{_token(key)}{_token(value)}")
    return "_".join(parts)


def table_path(root: str | os.PathLike, arch: str, kernel: str, shape: Mapping[str, Any],
               device: str | None = None) -> Path:
    """Where the arch table (``device=None``) or a device's table for this shape lives under ``root``."""
    base = Path(root) / check_arch(arch) / check_kernel_name(kernel)
    if device is not None:
        base = base / device_dir(device)
    return base / f"{shape_stem(shape)}.json"


def density_key(density: float) -> float:
    """Densities equal to 9 significant digits are one table key (routes / E is rarely exact)."""
    return float(f"{density:.9g}")


# ---- reading and validating -----------------------------------------------------------------------
def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


@functools.lru_cache(maxsize=1)
def _validator():
    """The schema's validator, or None where jsonschema is not installed (a bare GPU image): tables are
    then checked for format, version and the rules below only, with one warning; CI checks the schema."""
    try:
        import jsonschema
    except ImportError:
        warnings.warn("jsonschema is not installed: tables are read without the schema check", stacklevel=3)
        return None
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def field_name(parts) -> str:
    """['entries', 3, 'time_ms'] -> 'entries[3].time_ms'."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def loads(text: str, path: str | os.PathLike = "<table>") -> dict[str, Any]:
    """Parse and validate a table; TableError naming ``path`` and the field on any problem."""
    if len(text) > MAX_TABLE_BYTES:
        raise TableError(path, "(file)", f"{len(text)} characters; a table is at most {MAX_TABLE_BYTES}")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as e:
        raise TableError(path, "(file)", f"not valid JSON: {e}") from None
    except RecursionError:
        raise TableError(path, "(file)", "JSON nested too deeply") from None
    try:
        validate(doc, path)
    except RecursionError:
        raise TableError(path, "(file)", "JSON nested too deeply") from None
    return doc


def read(path: str | os.PathLike) -> dict[str, Any]:
    try:
        size = os.stat(path).st_size
        if size > MAX_TABLE_BYTES:
            raise TableError(path, "(file)", f"{size} bytes; a table is at most {MAX_TABLE_BYTES}")
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(path, "(file)", f"cannot read: {e}") from None
    return loads(text, path)


def validate(doc: Any, path: str | os.PathLike = "<table>") -> None:
    """Schema first (format and version before anything else), then what a schema cannot say."""
    if not isinstance(doc, dict):
        raise TableError(path, "(top level)", "a table is a JSON object")
    if doc.get("format") != FORMAT:
        raise TableError(path, "format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
    if doc.get("version") != VERSION:
        raise TableError(path, "version", f"this moetune reads table version {VERSION}, "
                                          f"got {doc.get('version')!r}")
    entries = doc.get("entries")
    if isinstance(entries, list) and len(entries) > MAX_ENTRIES:
        raise TableError(path, "entries", f"{len(entries)} entries; a table holds at most {MAX_ENTRIES}")
    validator = _validator()
    errors = list(validator.iter_errors(doc)) if validator is not None else []
    if errors:
        from jsonschema.exceptions import best_match

        err = best_match(errors)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise TableError(path, field_name(err.absolute_path), err.message + more)
    device = doc["device"]
    if device is not None and doc["device_names"] != [device]:
        raise TableError(path, "device_names", f"a device table lists only its device {device!r}")
    previous = 0.0
    for i, entry in enumerate(doc["entries"]):
        d = entry["density"]
        if d <= previous:
            raise TableError(path, f"entries[{i}].density",
                             f"densities must increase strictly (got {d!r} after {previous!r})")
        previous = d
        for key in ENTRY_KEYS:
            value = entry.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                raise TableError(path, f"entries[{i}].{key}", f"must be finite, got {value!r}")
        t, base, speedup = entry["time_ms"], entry["default_ms"], entry["speedup"]
        if (base is None) != (speedup is None):
            raise TableError(path, f"entries[{i}].speedup", "speedup and default_ms go together")
        if base is not None and not math.isclose(speedup, base / t, rel_tol=1e-3):
            raise TableError(path, f"entries[{i}].speedup",
                             f"{speedup!r} is not default_ms / time_ms = {base / t:.6g}")
        if "device" in entry and entry["device"] not in doc["device_names"]:
            raise TableError(path, f"entries[{i}].device",
                             f"{entry['device']!r} is not one of device_names {doc['device_names']}")


# ---- writing ------------------------------------------------------------------------------------
def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), allow_nan=False)


def _entry_line(entry: Mapping[str, Any]) -> str:
    ordered = [k for k in ENTRY_KEYS if k in entry] + sorted(set(entry) - set(ENTRY_KEYS))
    return "{" + ", ".join(f"{json.dumps(k)}: {_compact(entry[k])}" for k in ordered) + "}"


def dumps(doc: Mapping[str, Any]) -> str:
    """Stable text: top-level keys in format order, nested keys sorted, one entry per line."""
    lines = []
    keys = [k for k in TOP_KEYS if k in doc] + sorted(set(doc) - set(TOP_KEYS))
    for k in keys:
        if k == "entries":
            body = ",\n".join(f"    {_entry_line(e)}" for e in doc[k])
            lines.append(f'  "entries": [\n{body}\n  ]' if body else '  "entries": []')
        else:
            lines.append(f"  {json.dumps(k)}: {_compact(doc[k])}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write through a temporary file in the same directory and rename it over ``path``:
    readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write(path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
    """Validate ``doc`` (never write a table the picker would refuse) and write it atomically."""
    validate(dict(doc), path)
    write_atomic(path, dumps(doc))


# ---- merging -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """What a merge did at one density: added, changed (new config), unchanged (same config,
    numbers refreshed) or kept (only in the old file)."""

    density: float
    status: str
    old_config: Mapping[str, Any] | None
    new_config: Mapping[str, Any] | None


_IDENTITY = ("kernel", "arch", "device", "shape")


def merge(old: Mapping[str, Any] | None, new: Mapping[str, Any],
          path: str | os.PathLike = "<table>") -> tuple[dict[str, Any], list[Change]]:
    """``new``'s entries replace ``old``'s at equal densities; old entries at other densities stay.

    Provenance fields (versions, date, candidates, default) come from ``new``; device names
    and strategies are the union, so the file still says where every kept entry came from.
    """
    if old is None:
        return dict(new), [Change(e["density"], "added", None, e["config"]) for e in new["entries"]]
    for key in _IDENTITY:
        if old[key] != new[key]:
            raise TableError(path, key, f"existing table has {old[key]!r}, the export has {new[key]!r}")
    by_key = {density_key(e["density"]): e for e in old["entries"]}
    changes: list[Change] = []
    for entry in new["entries"]:
        prev = by_key.pop(density_key(entry["density"]), None)
        if prev is None:
            status = "added"
        else:
            status = "unchanged" if dict(prev["config"]) == dict(entry["config"]) else "changed"
        changes.append(Change(entry["density"], status, prev and prev["config"], entry["config"]))
    changes += [Change(e["density"], "kept", e["config"], e["config"]) for e in by_key.values()]
    entries = sorted(list(by_key.values()) + list(new["entries"]), key=lambda e: e["density"])
    merged = dict(new)
    merged["entries"] = entries
    if new["device"] is None:
        names = {e["device"] for e in entries if "device" in e} | set(new["device_names"])
        merged["device_names"] = sorted(names)
    merged["strategy"] = sorted(set(old["strategy"]) | set(new["strategy"]))
    changes.sort(key=lambda c: c.density)
    return merged, changes
