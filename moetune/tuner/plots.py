"""PNG plots of what tuning bought: time versus density, and a heat map of one tile parameter.

Two pictures per (kernel, shape, device):

* time versus route density (log x, log y) for the shipped default, the heuristic
  and the tuned config, with their speedup over the default underneath. From a
  ``moetune bench`` CSV the tuned line is the picker's answer; from the results
  store it is the best accurate config measured at each point, and the heuristic
  appears where a sweep happened to measure it.
* a heat map of the best accurate time per (BLOCK_SIZE_M, or the op's first tile
  parameter, x density), from the store; colour is the time over the best at that
  density, so every column reads the same way, and each cell carries its time.

matplotlib (the ``plot`` extra) is imported only here, with the Agg backend, so the
rest of moetune never needs it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.problem import canonical_json
from moetune.specs.base import KernelSpec
from moetune.specs.registry import get_spec

BENCH_COLUMNS = ("kernel", "shape", "routing", "density", "device", "arch", "default_ms", "heuristic_ms",
                 "tuned_ms")
HEAT_PARAM = "BLOCK_SIZE_M"
MAX_DENSITY_TICKS = 12


@dataclass
class Series:
    """One shape's times per density (rows sorted by density) and what to call the lines."""

    kernel: str
    shape: str  # canonical JSON
    device: str
    arch: str
    frame: Any  # pandas DataFrame: density, default_ms, heuristic_ms, tuned_ms
    tuned_label: str


def figure_class():
    """matplotlib's Figure with the Agg canvas (no display, no global pyplot state), or a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("moetune plot needs matplotlib: pip install 'moetune[plot]'") from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure


def _spec(kernel: str) -> KernelSpec | None:
    try:
        return get_spec(kernel)
    except ValueError:  # rows of an op this install does not have: plot what the rows say
        return None


def shape_key(kernel: str, shape: str | Mapping[str, Any]) -> str:
    """Canonical JSON of a shape given as "E=8,N=256,..." text or a dict, defaults filled in."""
    from moetune.tuner.problems import parse_shape

    raw = parse_shape(shape) if isinstance(shape, str) else dict(shape)
    spec = _spec(kernel)
    return canonical_json(spec.normalize_shape(raw) if spec else raw)


def model_shape_key(kernel: str, model: str, tp: int = 1, ep: int = 1) -> str:
    from moetune.models import get_model

    spec = get_spec(kernel)
    return canonical_json(spec.normalize_shape(spec.shape_from_model(get_model(model), tp, ep)))


def shape_label(shape: str) -> str:
    from moetune.tables.format import shape_stem

    try:
        return shape_stem(json.loads(shape))
    except (KeyError, TypeError, ValueError):
        return shape


def _pick_device(df, device: str | None, source: str) -> str:
    """The named device (must be present) or the one with the most rows."""
    devices = df["device_name" if "device_name" in df else "device"]
    if device is not None:
        if not (devices == device).any():
            raise ValueError(f"--device {device!r}: no rows in {source}; devices there: "
                             f"{', '.join(sorted(devices.dropna().unique())) or 'none'}")
        return device
    return str(devices.value_counts().index[0])


def _select(df, kernel: str, shape: str | None, routing: str, source: str):
    """Rows of ``kernel`` (and ``shape`` when given) under ``routing``; ValueError naming what is missing."""
    rows = df[df["kernel"] == kernel]
    if rows.empty:
        kernels = ", ".join(sorted(df["kernel"].dropna().unique())) or "none"
        raise ValueError(f"--kernel {kernel!r}: no rows in {source}; kernels there: {kernels}")
    if shape is not None:
        rows = rows[rows["shape"] == shape]
        if rows.empty:
            raise ValueError(f"no {kernel} rows for shape {shape_label(shape)} in {source}")
    picked = rows[rows["routing"] == routing]
    if picked.empty:
        raise ValueError(f"--routing {routing!r}: no {kernel} rows in {source}; routings there: "
                         f"{', '.join(sorted(rows['routing'].unique()))}")
    return picked


# ---- data -------------------------------------------------------------------------------------------------
def series_from_bench(csv: str | Path, kernel: str, shape: str | None = None, *, device: str | None = None,
                      routing: str = "uniform") -> list[Series]:
    """One series per shape of ``kernel`` in a ``moetune bench --csv`` file; points of equal density
    (e.g. 2 tokens at 1/2 active and 1 token) are averaged."""
    import pandas as pd

    path = Path(csv)
    if not path.is_file():
        raise FileNotFoundError(f"--bench {path}: no such file")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"--bench {path} is not a CSV file: {e}") from None
    missing = [c for c in BENCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"--bench {path} is not a moetune bench CSV "
                         f"(missing column(s) {', '.join(missing)})")
    rows = _select(df, kernel, shape, routing, f"--bench {path}")
    device = _pick_device(rows, device, f"--bench {path}")
    rows = rows[rows["device"] == device]
    out = []
    for key, group in rows.groupby("shape", sort=True):
        frame = group.groupby("density", as_index=False)[["default_ms", "heuristic_ms", "tuned_ms"]].mean()
        out.append(Series(kernel, str(key), device, str(group["arch"].iloc[0]), frame.sort_values("density"),
                          "tuned (table pick)"))
    return out


def store_rows(db: str | Path, kernel: str, shape: str | None = None, *, device: str | None = None,
               routing: str = "uniform"):
    """The store's rows for ``kernel`` on one device (the most measured unless named) under ``routing``."""
    from moetune.tuner.store import read_frame

    every = read_frame(db, "--db")  # a store, gzipped or not, or an export of one
    df = every[every["kernel"] == kernel]
    if df.empty:
        counts = every["kernel"].value_counts()
        raise ValueError(f"--kernel {kernel!r}: no rows in {db}; kernels there: "
                         f"{', '.join(sorted(counts.index)) or 'none'}")
    rows = _select(df, kernel, shape, routing, str(db))
    device = _pick_device(rows, device, str(db))
    return rows[rows["device_name"] == device]


def series_from_store(rows, kernel: str) -> list[Series]:
    """Per shape: the default's time, the heuristic's (where measured) and the best accurate time at each
    point, averaged over points of equal density."""
    import pandas as pd

    spec = _spec(kernel)
    out = []
    for key, group in rows.groupby("shape", sort=True):
        shape = json.loads(key)
        arch = str(group["arch"].iloc[0])
        points = []
        for (_, routes, _), pt in group.groupby(["tokens", "routes", "active_fraction"]):
            ok = pt[pt["status"] == "ok"]
            rec = {"density": float(pt["density"].iloc[0]), "default_ms": math.nan, "heuristic_ms": math.nan,
                   "tuned_ms": ok["time_ms"].min() if not ok.empty else math.nan}
            if spec is not None:
                default = canonical_json(dict(spec.default))
                heuristic = canonical_json({**spec.default, **spec.heuristic(shape, int(routes), arch)})
                for role, cfg in (("default", default), ("heuristic", heuristic)):
                    hit = ok[ok["config"] == cfg]["time_ms"]
                    if not hit.empty:
                        rec[f"{role}_ms"] = float(hit.median())
            points.append(rec)
        frame = pd.DataFrame(points).groupby("density", as_index=False).mean().sort_values("density")
        out.append(Series(kernel, str(key), str(group["device_name"].iloc[0]), arch, frame,
                          "best measured (sweep)"))
    return out


def tile_param(rows, kernel: str) -> str:
    """BLOCK_SIZE_M where the op has it, else its first tunable parameter."""
    spec = _spec(kernel)
    keys = list(spec.space) if spec and spec.space else list(json.loads(rows["config"].iloc[0]))
    return HEAT_PARAM if HEAT_PARAM in keys else keys[0]


def heat_frame(rows, param: str):
    """Best accurate time per (param value, density): param values as the index, densities as columns."""
    ok = rows[rows["status"] == "ok"].copy()
    if ok.empty:
        return None
    ok["value"] = [json.loads(c).get(param) for c in ok["config"]]
    ok = ok[ok["value"].notna()]
    if ok.empty:
        return None
    return ok.pivot_table(index="value", columns="density", values="time_ms", aggfunc="min").sort_index()


# ---- drawing ----------------------------------------------------------------------------------------------
def _title(what: str, s_kernel: str, shape: str, device: str, arch: str) -> str:
    note = " (interpreter: times are meaningless)" if arch == "interpreter" else ""
    return f"{s_kernel} {shape_label(shape)}\n{what} on {device}{note}"


LINES = (("default_ms", "shipped default", "tab:gray", "o"), ("heuristic_ms", "heuristic", "tab:blue", "s"),
         ("tuned_ms", None, "tab:green", "^"))


def plot_time(series: Series, path: str | Path) -> Path:
    """Time (top) and speedup over the default (bottom) versus density, log x."""
    Figure = figure_class()
    fig = Figure(figsize=(8, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    f = series.frame
    for col, label, color, marker in LINES:
        y = f[col]
        if y.notna().any():
            top.plot(f["density"], y, marker=marker, color=color, label=label or series.tuned_label)
            if col != "default_ms" and f["default_ms"].notna().any():
                bottom.plot(f["density"], f["default_ms"] / y, marker=marker, color=color,
                            label=label or series.tuned_label)
    top.set_xscale("log")
    top.set_yscale("log")
    from matplotlib.ticker import LogLocator

    top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.01 0.02 0.05 0.1: readable times
    _plain(top.yaxis, top.get_ylim())
    _plain(bottom.xaxis, bottom.get_xlim())
    if len(f) <= MAX_DENSITY_TICKS:  # ticks at the measured densities: what was run, read off directly
        bottom.set_xticks(list(f["density"]), [f"{d:g}" for d in f["density"]])
        bottom.xaxis.set_minor_formatter(_null())
    top.set_ylabel("time per launch (ms)")
    top.grid(True, which="both", alpha=0.3)
    top.legend()
    top.set_title(_title("time versus route density", series.kernel, series.shape, series.device,
                         series.arch))
    bottom.axhline(1.0, color="tab:gray", linewidth=1)
    bottom.set_xlabel("route density (rows per expert)")
    bottom.set_ylabel("speedup over default (x)")
    bottom.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_heat(frame, param: str, kernel: str, shape: str, device: str, arch: str, path: str | Path) -> Path:
    """Cells coloured by time over the column's best (1 = best at that density), annotated in ms."""
    import numpy as np
    from matplotlib.colors import LogNorm

    Figure = figure_class()
    values = frame.to_numpy(dtype=float)
    ratio = values / np.nanmin(values, axis=0, keepdims=True)
    rows, cols = values.shape
    fig = Figure(figsize=(max(6.0, 1.0 + 0.9 * cols), max(3.5, 1.8 + 0.5 * rows)), layout="constrained")
    ax = fig.subplots()
    top = max(2.0, float(np.nanmax(ratio)))
    im = ax.imshow(np.ma.masked_invalid(ratio), cmap="viridis_r", norm=LogNorm(1.0, top), aspect="auto")
    for i in range(rows):
        for j in range(cols):
            if not math.isnan(values[i, j]):
                ax.text(j, i, f"{values[i, j]:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if ratio[i, j] > math.sqrt(top) else "black")
    ax.set_xticks(range(cols), [f"{d:.3g}" for d in frame.columns])
    ax.set_yticks(range(rows), [str(v) for v in frame.index])
    ax.set_xlabel("route density (rows per expert)")
    ax.set_ylabel(param)
    ax.set_title(_title(f"best time (ms) per {param} and density", kernel, shape, device, arch))
    _plain(fig.colorbar(im, ax=ax, label="time / best at this density").ax.yaxis, (1.0, top))
    return _save(fig, path)


def _plain(axis: Any, limits: tuple[float, float] | None = None) -> None:
    """Tick labels as plain numbers (0.14, 2, 64) rather than powers of ten: times read at a glance.
    Minor ticks get labels only on a log axis spanning less than a decade (else too crowded)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    narrow = limits is not None and min(limits) > 0 and max(limits) / min(limits) < 10
    axis.set_minor_formatter(fmt if narrow else NullFormatter())


def _null() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def _stem(kernel: str, shape: str, device: str, routing: str) -> str:
    from moetune.device import safe_name

    tail = "" if routing == "uniform" else "_" + safe_name(routing)
    return f"{safe_name(kernel)}_{safe_name(shape_label(shape))}_{safe_name(device)}{tail}"


def make_plots(kernel: str, out: str | Path, *, db: str | Path | None = None,
               bench_csv: str | Path | None = None, shape: str | None = None, device: str | None = None,
               routing: str = "uniform") -> list[Path]:
    """Write the plots for ``kernel`` (every shape found, or ``shape``: canonical JSON) into ``out``.

    Time versus density comes from ``bench_csv`` when given, else from the store ``db``; the heat map
    needs ``db``. Returns the written paths.
    """
    if db is None and bench_csv is None:
        raise ValueError("give --db (a results store) or --bench (a moetune bench CSV)")
    figure_class()  # a missing matplotlib fails before anything is read or made
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    rows = store_rows(db, kernel, shape, device=device, routing=routing) if db is not None else None
    series: Sequence[Series] = (series_from_bench(bench_csv, kernel, shape, device=device, routing=routing)
                                if bench_csv is not None else series_from_store(rows, kernel))
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_time(s, out / f"{_stem(kernel, s.shape, s.device, routing)}_time.png") for s in series]
    if rows is not None:
        param = tile_param(rows, kernel)
        for key, group in rows.groupby("shape", sort=True):
            frame = heat_frame(group, param)
            if frame is None:
                continue
            dev, arch = str(group["device_name"].iloc[0]), str(group["arch"].iloc[0])
            path = out / f"{_stem(kernel, str(key), dev, routing)}_heatmap.png"
            written.append(plot_heat(frame, param, kernel, str(key), dev, arch, path))
    return written
