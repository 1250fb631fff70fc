"""The tile picker: which config a kernel launch uses when the caller gives none.

Lookup, first hit wins:

1. each directory in ``MOETUNE_CONFIG_DIR`` (``os.pathsep``-separated), then the packaged
   tables (:func:`packaged_dirs`); in each directory the table for this exact device
   name, then the one for its arch;
2. in that table, the entry whose density (rows per expert) is nearest in log space; a tie
   goes to the lower density; densities outside the table's range take the nearest end. An
   entry whose config the kernel's constraints reject at this point is skipped for the next
   nearest;
3. else the kernel's heuristic for the arch (its :class:`~moetune.kernels.rules.TileRules`).

Serving never fails on a table: a missing one is a single log line, an unreadable,
corrupt or foreign-version one a single :class:`TableWarning`, and the answer falls
through to the next table or the heuristic. Answers are cached per (kernel, shape,
routes, device), so a call per forward pass costs a dict lookup; tables and
``MOETUNE_CONFIG_DIR`` are read when an answer is first needed, and again after
:func:`clear_cache`.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from moetune.device import DeviceInfo, device_info
from moetune.kernels.rules import TileRules, get_rules
from moetune.problem import Problem
from moetune.tables import format as tables

ENV_VAR = "MOETUNE_CONFIG_DIR"
log = logging.getLogger(__name__)


class TableWarning(UserWarning):
    """A table exists but cannot be used; the picker fell back."""


@dataclass(frozen=True)
class Pick:
    """A picked config and where it came from.

    ``source``: "device" (a table for this device name), "arch" (its arch's table) or
    "heuristic"; ``path``: the table file; ``density_key``: the table entry's density.
    """

    config: Mapping[str, Any]
    source: str
    path: str | None = None
    density_key: float | None = None


PACKAGED = Path(__file__).resolve().parent.parent / "configs"


def packaged_dirs() -> tuple[Path, ...]:
    """Tables shipped with moetune: ``moetune/configs``, in the wheel and in a source checkout alike."""
    return (PACKAGED,) if PACKAGED.is_dir() else ()


def config_dirs() -> tuple[Path, ...]:
    """Directories searched in order: ``MOETUNE_CONFIG_DIR`` entries, then the packaged ones."""
    env = os.environ.get(ENV_VAR)
    return tuple(Path(p) for p in (env or "").split(os.pathsep) if p) + packaged_dirs()


def pick_config(kernel: str, shape: Mapping[str, Any], routes: int, *,
                device: DeviceInfo | str | None = None) -> dict[str, Any]:
    """The config for ``kernel`` at ``shape`` with ``routes`` routed rows on ``device``
    (a DeviceInfo, a device name, or None for the current device)."""
    return dict(pick_config_with_source(kernel, shape, routes, device=device).config)


def pick_config_with_source(kernel: str, shape: Mapping[str, Any], routes: int, *,
                            device: DeviceInfo | str | None = None, arch: str | None = None) -> Pick:
    """:func:`pick_config` plus where the answer came from. ``arch`` overrides the device's arch
    (for asking about a GPU this machine does not have)."""
    if type(routes) is not int:  # numpy / torch integers; bool and float are refused
        if isinstance(routes, bool) or not hasattr(routes, "__index__"):
            raise ValueError(f"routes must be an int >= 0, got {routes!r}")
        routes = operator.index(routes)
    # The key is cheap on purpose (no sorting, no environment read): this runs every forward pass.
    return _pick(kernel, tuple(shape.items()), routes, device, arch)


@dataclass(frozen=True)
class _Lookup:
    """Everything about a (kernel, shape, device) that does not depend on routes."""

    rules: TileRules
    shape: dict
    arch: str
    name: str
    info: DeviceInfo | None  # for constraint checks; None when only a name is known
    tables: tuple  # (source, path, table) in lookup order, usable tables only
    dirs: tuple[Path, ...]


@functools.lru_cache(maxsize=1024)
def _lookup(kernel: str, shape_items: tuple, device: DeviceInfo | str | None, arch: str | None) -> _Lookup:
    rules = get_rules(kernel)
    shape = rules.normalize_shape(dict(shape_items))
    if device is None:
        device = device_info()
    info = device if isinstance(device, DeviceInfo) else None
    name = device.name if info else str(device)
    dirs = config_dirs()
    if arch is None:
        arch = info.arch if info else _arch_of(name, kernel, dirs)
    if info is not None and info.arch != arch:
        info = None  # the device's own limits say nothing about another arch
    found = []
    for root in dirs:
        for source, path in _candidate_paths(root, arch, kernel, shape, name):
            table = _load(str(path))
            if table is not None and table["entries"]:
                found.append((source, str(path), table))
    return _Lookup(rules, shape, arch, name, info, tuple(found), dirs)


@functools.lru_cache(maxsize=8192)
def _pick(kernel: str, shape_items: tuple, routes: int, device: DeviceInfo | str | None,
          arch: str | None) -> Pick:
    lk = _lookup(kernel, shape_items, device, arch)
    if routes < 0:
        raise ValueError(f"routes must be an int >= 0, got {routes!r}")
    for source, path, table in lk.tables:
        hit = _nearest(table, lk.rules, lk.shape, routes, lk.info)
        if hit is not None:
            return Pick(MappingProxyType(dict(hit["config"])), source, path, hit["density"])
    _note_missing(kernel, lk.shape, lk.arch, lk.name, lk.dirs)
    return Pick(MappingProxyType(dict(lk.rules.heuristic(lk.shape, routes, lk.arch))), "heuristic")


def table_neighbours(kernel: str, shape: Mapping[str, Any], routes: int, *, device: DeviceInfo) -> list[dict]:
    """The configs of the table entries nearest to ``routes`` on either side in density (the ones the
    picker chooses between around it), nearest first, from the first table that has entries; [] when
    none does. A sweep measures them first (warm starts), so a new entry is never worse than them."""
    lk = _lookup(kernel, tuple(shape.items()), device, None)
    if not lk.tables:
        return []
    table = lk.tables[0][2]
    x = math.log(routes / lk.shape["E"]) if routes > 0 else -math.inf
    below = [i for i, d in enumerate(table["_logd"]) if d <= x]
    above = [i for i, d in enumerate(table["_logd"]) if d > x]
    sides = [max(below, key=lambda i: table["_logd"][i]) if below else None,
             min(above, key=lambda i: table["_logd"][i]) if above else None]
    sides = sorted((i for i in sides if i is not None), key=lambda i: abs(table["_logd"][i] - x))
    return [dict(table["entries"][i]["config"]) for i in sides]


def _candidate_paths(root: Path, arch: str, kernel: str, shape: dict, name: str):
    try:
        if name:
            yield "device", tables.table_path(root, arch, kernel, shape, device=name)
    except ValueError as e:
        _warn_once(f"device:{name}", f"no device table lookup for {name!r}: {e}")
    try:
        yield "arch", tables.table_path(root, arch, kernel, shape)
    except ValueError as e:
        _warn_once(f"arch:{arch}", f"no table lookup for arch {arch!r}: {e}")


def _arch_of(name: str, kernel: str, dirs: tuple[Path, ...]) -> str:
    """The arch of a device known only by name: the current device's, else the arch directory
    holding that device's tables for ``kernel``, else "unknown"."""
    current = device_info()
    if current.name == name:
        return current.arch
    try:
        slug = tables.device_dir(name)
    except ValueError:
        return "unknown"
    for root in dirs:
        for arch_dir in sorted(root.glob(f"*/{kernel}/{slug}")):
            return arch_dir.parent.parent.name
    return "unknown"


@functools.cache
def _load(path: str) -> dict | None:
    """A validated table, or None (missing: silently; anything else: one warning)."""
    if not os.path.exists(path):
        return None
    try:
        doc = tables.read(path)
        rules = get_rules(doc["kernel"])
        for i, entry in enumerate(doc["entries"]):
            try:
                rules.check_config(entry["config"])
            except ValueError as e:
                raise tables.TableError(path, f"entries[{i}].config", str(e)) from None
    except Exception as e:  # TableError, unknown kernel, or anything else a file's content provokes
        _warn_once(path, f"ignoring table: {e}")
        return None
    doc["_logd"] = [math.log(e["density"]) for e in doc["entries"]]
    return doc


def _nearest(table: dict, rules: TileRules, shape: dict, routes: int, info: DeviceInfo | None) -> dict | None:
    entries, logd = table["entries"], table["_logd"]
    x = math.log(routes / shape["E"]) if routes > 0 else -math.inf
    # Distances equal to 1e-9 are a tie (float logs of 2 and 8 are not equidistant from 4); lower wins.
    order = sorted(range(len(entries)), key=lambda i: (round(abs(logd[i] - x), 9), i))
    if info is None:
        return entries[order[0]]
    problem = Problem(rules.name, shape, max(1, -(-routes // shape["top_k"])), routes)
    for i in order:
        try:
            if rules.constraint(dict(entries[i]["config"]), problem, info) is None:
                return entries[i]
        except Exception:  # a constraint that cannot judge this point does not get to pick it
            continue
    return None


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, TableWarning, stacklevel=2)


def _note_missing(kernel: str, shape: dict, arch: str, name: str, dirs: tuple[Path, ...]) -> None:
    key = f"missing:{kernel}:{tables.shape_stem(shape)}:{arch}:{name}"
    if key in _warned:
        return
    _warned.add(key)
    level = logging.DEBUG if arch == "interpreter" else logging.WARNING
    log.log(level, "no moetune table for %s %s on %s (%s) in %s; using the heuristic", kernel,
            tables.shape_stem(shape), name or "?", arch, ", ".join(map(str, dirs)) or "no config dirs")


def clear_cache() -> None:
    """Forget every table and answer read so far (after tables changed on disk)."""
    _pick.cache_clear()
    _lookup.cache_clear()
    _load.cache_clear()
    _warned.clear()
