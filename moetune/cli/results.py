"""``moetune results``: list and filter what the results store holds; export it as CSV or Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from moetune.cli import app
from moetune.cli._common import (
    DEFAULT_DB,
    check_kernels,
    console,
    fail,
    fmt_config,
    kernel_list,
    of_kernels,
    split_list,
    user_errors,
)

# The default view fits 100 columns, one line a row; --wide prints these columns, folded to fit.
WIDE = ("id", "kernel", "device_name", "tokens", "routes", "active_fraction", "status", "error", "time_ms",
        "spread", "roofline_frac", "config", "reason")
NARROW = ("id", "kernel", "point", "status", "ms", "config")


def select(frame, kernel: list[str], status: list[str], device: str | None):
    """Rows of ``frame`` for the given ops (or families), statuses and device name (case-insensitive).
    A kernel name that matches no row and no known op is a ValueError."""
    from moetune.tuner.store import STATUSES

    bad = [s for s in status if s not in STATUSES]
    if bad:
        raise ValueError(f"--status {', '.join(bad)} unknown; statuses: {', '.join(STATUSES)}")
    if kernel:
        check_kernels(n for n in kernel if not frame["kernel"].map(lambda k, n=n: of_kernels(k, [n])).any())
        frame = frame[frame["kernel"].map(lambda k: of_kernels(k, kernel))]
    if status:
        frame = frame[frame["status"].isin(status)]
    if device:
        frame = frame[frame["device_name"].str.lower() == device.lower()]
    return frame


def _cell(v) -> str:
    if v is None or v != v:  # None or NaN
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _point(row) -> str:
    text = f"t{row['tokens']} r{row['routes']}"
    if row["active_fraction"] not in (1, None):
        text += f" a{row['active_fraction']:g}"
    return text if row["routing"] in ("uniform", None) else f"{text} {row['routing']}"


def _narrow_row(row) -> list:
    try:
        config = fmt_config(json.loads(row["config"]))
    except (TypeError, ValueError):
        config = _cell(row["config"])
    text = config if row["status"] == "ok" or not _cell(row["reason"]) else f"{config}: {row['reason']}"
    return [_cell(row["id"]), _cell(row["kernel"]), _point(row), _cell(row["status"]), _cell(row["time_ms"]),
            Text(text, no_wrap=True, overflow="ellipsis")]


def rows_table(frame, wide: bool) -> Table:
    t = Table(show_edge=False)
    if wide:
        for col in WIDE:
            t.add_column(col, overflow="fold")
        for _, row in frame.iterrows():
            t.add_row(*(_cell(row[c]) if c in row else "" for c in WIDE))
        return t
    for col in NARROW:
        t.add_column(col, no_wrap=col != "config", justify="right" if col in ("id", "ms") else "left")
    for _, row in frame.iterrows():
        t.add_row(*_narrow_row(row))
    return t


@app.command()
def results(
    db: Annotated[Path, typer.Option(help="results database (.sqlite, .sqlite.gz) or an export of one")] \
        = Path(DEFAULT_DB),
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k", help="ops or families (repeat or "
                                                     "comma-separate)")] = None,
    status: Annotated[str | None, typer.Option(help="statuses, e.g. ok,inaccurate")] = None,
    device: Annotated[str | None, typer.Option(help="device name, e.g. 'NVIDIA H200'")] = None,
    csv: Annotated[Path | None, typer.Option(help="write the selected rows here as CSV")] = None,
    parquet: Annotated[Path | None, typer.Option(help="write the selected rows here as Parquet")] = None,
    limit: Annotated[int, typer.Option(help="rows to print (the newest); 0 prints only counts")] = 30,
    wide: Annotated[bool, typer.Option(help="every column (device, error, spread, roofline, the config "
                                            "as JSON, the reason), folded to fit")] = False,
) -> None:
    """List measurements in the store (pandas underneath), filtered; optionally export them."""
    from moetune.tuner.store import read_frame

    with user_errors():
        frame = select(read_frame(db, "--db"), kernel_list(kernel), split_list(status), device)
    if csv:
        frame.to_csv(csv, index=False)
    if parquet:
        try:
            frame.to_parquet(parquet, index=False)
        except ImportError as e:
            fail(f"--parquet needs pyarrow or fastparquet (pip install pyarrow): {e}")
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    console.print(f"{len(frame)} row(s) in {db}" + (": " + ", ".join(f"{s} {n}" for s, n in counts.items())
                                                     if counts else ""))
    if limit > 0 and len(frame):
        console.print(rows_table(frame.tail(limit), wide))
    for path in (csv, parquet):
        if path:
            console.print(f"wrote {len(frame)} row(s) to {path}")
