"""``moetune replay``: score search strategies against stored exhaustive results, on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from moetune.cli import app
from moetune.cli._common import console, kernel_list, split_list, user_errors
from moetune.cli.display import progress


def _table(title: str, frame, columns: dict[str, str]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in columns.values():
        t.add_column(col, justify="left" if col in ("strategy", "budget", "point") else "right")
    for row in frame.to_dict("records"):
        t.add_row(*(_cell(row[k]) for k in columns))
    return t


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def markdown(summary, points, command: str, models=None) -> str:
    """The tables as Markdown, the command that made them first."""
    def md(frame) -> str:
        cols = list(frame.columns)
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in frame.to_dict("records")]
        return "\n".join(lines)

    grids = "" if models is None else f"\n\nPer model grid:\n\n{md(models)}"
    return f"`{command}`\n\n{md(summary)}{grids}\n\nPer point:\n\n{md(points)}\n"


SUMMARY_COLUMNS = {"strategy": "strategy", "budget": "budget", "measurements": "measured",
                   "rounds": "batches", "share": "of exhaustive", "quality": "quality (geomean)",
                   "worst_point": "worst point",
                   "within_5pct": "within 5%", "found": "found best"}
MODEL_COLUMNS = {"strategy": "strategy", "budget": "budget", "model": "model", "points": "points",
                 "measurements": "measured", "exhaustive": "exhaustive", "quality": "quality (geomean)",
                 "worst_point": "worst point"}
POINT_COLUMNS = {"strategy": "strategy", "budget": "budget", "point": "point", "exhaustive": "exhaustive",
                 "measurements": "measured", "extra": "of them 2nd pass", "rounds": "batches",
                 "quality": "quality", "worst": "worst seed", "found": "found best"}


@app.command()
def replay(
    data: Annotated[Path, typer.Option(help="exhaustive results: a store (.sqlite) or an export "
                                            "(.csv, .csv.gz, .parquet)")],
    strategy: Annotated[str, typer.Option(help="strategies, comma separated")] = "model,coordinate,random",
    budget: Annotated[str, typer.Option(help="measurements per point, comma separated; N or P% of the "
                                             "point's exhaustive count")] = "5%,10%",
    grid_budget: Annotated[bool, typer.Option("--grid-budget", help="spend each --budget over each model "
                                              "grid instead (P%: of all its points' evaluations, N: N for "
                                              "each point), in two passes as moetune sweep --grid-budget "
                                              "does: the same total, more where neighbours disagree")
                           ] = False,
    seeds: Annotated[int, typer.Option(help="seeds per (strategy, budget, point)")] = 20,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", "-k", help="ops or families (repeat or "
                                                     "comma-separate)")] = None,
    batch: Annotated[int, typer.Option(help="candidates proposed per batch (GPUs measuring at once)")] = 1,
    noise: Annotated[float, typer.Option(help="scale of the recorded noise drawn per measurement")] = 1.0,
    heuristic: Annotated[bool | None, typer.Option(help="measure the spec's heuristic first, as a sweep "
                                                        "does (off: when the heuristic was derived from "
                                                        "this data; off by default with --holdout)")] = None,
    holdout: Annotated[bool, typer.Option(help="leave one model out: a prior search at a point learns from "
                                               "--train less every store row of the point's model")] = False,
    warm_starts: Annotated[bool, typer.Option(help="warm starts from this replay's other ops and densities, "
                                                   "as a sweep has them")] = True,
    train: Annotated[list[Path] | None, typer.Option(help="stores the prior strategy learns from (repeat; "
                                                          "default: the committed data/ stores)")] = None,
    noise_model: Annotated[str, typer.Option(help="'spread': the recorded spread x --noise; 'repeat': the "
                                                  "noise of repeated sweeps of a point (fitted on "
                                                  "--noise-data) x --noise")] = "spread",
    noise_data: Annotated[list[Path] | None, typer.Option(help="stores to fit --noise-model repeat on "
                                                               "(repeat; default: the committed data/ "
                                                               "stores)")] = None,
    min_candidates: Annotated[int, typer.Option(help="leave out points with fewer configs (fragments of a "
                                                     "cut sweep)")] = 20,
    per_point: Annotated[bool, typer.Option(help="also print the per-point table")] = True,
    csv: Annotated[Path | None, typer.Option(help="write every run (one row per seed) here as CSV")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="write the tables here as "
                                                                         "Markdown")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Replay strategies on stored exhaustive sweeps: quality of the config found vs measurements made.

    Quality = recorded time of the declared winner / recorded exhaustive best (1.000 = found it).
    """
    import shlex
    import sys

    from moetune.tuner import replay as rp
    from moetune.tuner.replay_noise import fit_repeat_noise
    from moetune.tuner.strategies.prior import PriorData, committed_stores

    with user_errors():
        if noise < 0:
            raise ValueError(f"--noise must be >= 0, got {noise}")
        if noise_model not in ("spread", "repeat"):
            raise ValueError(f"--noise-model must be 'spread' or 'repeat', got {noise_model!r}")
        budgets = rp.parse_budgets(budget)
        strategies = split_list(strategy)
        rp.replay([], strategies, budgets, seeds, batch)  # bad names and counts fail before the data loads
        skipped: list[str] = []
        with progress("replay", f"reading {data}", quiet) as on_progress:
            points = rp.load_points(data, kernel_list(kernel), min_candidates, skipped)
            prior = None
            if "prior" in strategies:
                prior = PriorData.from_stores(train if train else committed_stores())
            fitted = None
            if noise_model == "repeat":
                fitted = _fit_noise(noise_data if noise_data else committed_stores(), fit_repeat_noise)
            honesty = rp.Honesty(holdout, (not holdout) if heuristic is None else heuristic, warm_starts,
                                 prior)
            runs = rp.replay(points, strategies, budgets, seeds, batch, noise, on_progress=on_progress,
                             honesty=honesty, noise_model=fitted, grid=grid_budget)
    for label in skipped:
        console.print(f"[yellow]note:[/] left out {label}")
    console.print(f"replay: {honesty.describe()}; noise: " +
                  (f"repeated sweeps x {noise:g} ({fitted.describe()})" if fitted is not None
                   else f"recorded spread x {noise:g}"))
    summ, pp, pm = rp.summary(runs), rp.per_point(runs), rp.per_model(runs)
    point_columns = POINT_COLUMNS if grid_budget else {k: v for k, v in POINT_COLUMNS.items() if k != "extra"}
    if per_point:
        console.print(_table("per point (quality over seeds)", pp, point_columns))
    console.print(_table("per model grid (measurements summed over its points)", pm, MODEL_COLUMNS))
    console.print(_table(f"replay: {len(points)} point(s), {seeds} seed(s), batch {batch}", summ,
                         SUMMARY_COLUMNS))
    if csv:
        runs.to_csv(csv, index=False)
    if markdown_out:
        command = "moetune " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        markdown_out.write_text(markdown(summ.rename(columns=SUMMARY_COLUMNS),
                                         pp[list(point_columns)].rename(columns=point_columns), command,
                                         pm.rename(columns=MODEL_COLUMNS)))


def _fit_noise(paths, fit):
    import pandas as pd

    from moetune.tuner.store import read_frame

    if not paths:
        raise ValueError("--noise-data: no stores to fit the repeat noise on")
    return fit(pd.concat([read_frame(p, "--noise-data") for p in paths], ignore_index=True))
