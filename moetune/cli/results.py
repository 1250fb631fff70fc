"""``moetune results``: list and filter what the results store holds; export it as CSV or Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moetune.cli import app
from moetune.cli._common import console, fail, split_list, user_errors

SHOWN = ("id", "kernel", "tokens", "routes", "active_fraction", "status", "time_ms", "spread",
         "roofline_frac", "config", "reason")


def select(frame, kernel: list[str], status: list[str], device: str | None):
    """Rows of ``frame`` for the given ops (or families), statuses and device name (case-insensitive)."""
    from moetune.tuner.store import STATUSES

    bad = [s for s in status if s not in STATUSES]
    if bad:
        raise ValueError(f"--status {', '.join(bad)} unknown; statuses: {', '.join(STATUSES)}")
    if kernel:
        frame = frame[frame["kernel"].map(lambda k: any(k == n or k.startswith(n + ".") for n in kernel))]
    if status:
        frame = frame[frame["status"].isin(status)]
    if device:
        frame = frame[frame["device_name"].str.lower() == device.lower()]
    return frame


@app.command()
def results(
    db: Annotated[Path, typer.Option(help="results database (.sqlite, .sqlite.gz) or an export of one")] \
        = Path("results/moetune.sqlite"),
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="ops or families, comma-separated")] \
        = None,
    status: Annotated[str | None, typer.Option(help="statuses, e.g. ok,inaccurate")] = None,
    device: Annotated[str | None, typer.Option(help="device name, e.g. 'NVIDIA H200'")] = None,
    csv: Annotated[Path | None, typer.Option(help="write the selected rows here as CSV")] = None,
    parquet: Annotated[Path | None, typer.Option(help="write the selected rows here as Parquet")] = None,
    limit: Annotated[int, typer.Option(help="rows to print (the newest); 0 prints only counts")] = 30,
) -> None:
    """List measurements in the store (pandas underneath), filtered; optionally export them."""
    from moetune.tuner.store import read_frame

    with user_errors():
        frame = select(read_frame(db, "--db"), split_list(kernel), split_list(status), device)
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
        t = Table(show_edge=False)
        for col in SHOWN:
            t.add_column(col, overflow="fold")
        for _, row in frame.tail(limit).iterrows():
            t.add_row(*("" if row[c] is None or row[c] != row[c] else
                        f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in SHOWN))
        console.print(t)
    for path in (csv, parquet):
        if path:
            console.print(f"wrote {len(frame)} row(s) to {path}")
