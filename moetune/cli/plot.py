"""``moetune plot``: PNGs of time versus density and of the best time per tile size and density."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli._common import console, user_errors


@app.command()
def plot(
    kernel: Annotated[str, typer.Option("--kernel", "-k", help="one op, e.g. fp8_decode.gate_up")],
    out: Annotated[Path, typer.Option(help="directory for the PNGs (created)")],
    db: Annotated[Path | None, typer.Option(help="results store (time plot unless "
                                                   "--bench; heat map)")] = None,
    bench: Annotated[Path | None, typer.Option(help="a moetune bench --csv file for the time plot")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="model preset giving the shape")] = None,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree (with --model)")] = 1,
    ep: Annotated[int, typer.Option(help="expert-parallel degree (with --model)")] = 1,
    shape: Annotated[str | None, typer.Option(help="per-rank shape, e.g. E=8,N=256,K=512,top_k=2 "
                                                   "(default: every shape found)")] = None,
    device: Annotated[str | None, typer.Option(help="device name (default: the most measured)")] = None,
    routing: Annotated[str, typer.Option(help="routing distribution of the points plotted")] = "uniform",
) -> None:
    """Plot default / heuristic / tuned time versus density and a heat map of the best time per
    (BLOCK_SIZE_M or first tile parameter, density); prints the written paths."""
    from moetune.tuner.plots import make_plots, model_shape_key, shape_key

    with user_errors():
        if model is not None and shape is not None:
            raise ValueError("give --model or --shape, not both")
        if model is None and (tp != 1 or ep != 1):
            raise ValueError("--tp/--ep need --model (an explicit --shape is already per rank)")
        key = model_shape_key(kernel, model, tp, ep) if model is not None else \
            shape_key(kernel, shape) if shape is not None else None
        written = make_plots(kernel, out, db=db, bench_csv=bench, shape=key, device=device, routing=routing)
    if not written:
        console.print("nothing to plot (no accurate measurements)")
    for path in written:
        console.print(str(path), highlight=False, soft_wrap=True)
