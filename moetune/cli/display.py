"""The sweep's live display (progress, per-worker rows, best so far) and its summary table; the progress
bar of the other long commands (replay, bench, export)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from moetune.cli._common import console, fmt_config

if TYPE_CHECKING:
    from moetune.tuner.backends.base import Backend

STATUS_STYLE = {"ok": "green", "inaccurate": "yellow", "compile_error": "magenta", "crash": "red",
                "timeout": "red", "invalid": "dim"}
FAILED = ("compile_error", "crash", "timeout", "invalid")
LIVE_POINTS = 12  # rows of the best-so-far table shown while sweeping


def config_change(kernel: str, config: dict[str, Any] | None) -> Text:
    """The keys where ``config`` differs from the op's default (``fmt_config`` order), "default" where
    none does; one line, cut with an ellipsis where the column is narrow (``moetune results`` and
    ``show --wide`` print configs in full)."""
    if config is None:
        return Text("")
    from moetune.kernels.rules import get_rules

    try:
        default = get_rules(kernel).default
    except ValueError:  # a kernel this process cannot name: the whole config
        default = {}
    change = {k: v for k, v in config.items() if default.get(k) != v}
    return Text(fmt_config(change) if change else "default", no_wrap=True, overflow="ellipsis")


def _point(p: Any) -> str:
    text = f"t{p.tokens} r{p.routes}"
    if p.active_fraction != 1:
        text += f" a{p.active_fraction:g}"
    return text if p.routing == "uniform" else f"{text} {p.routing}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


class Display:
    """Rich progress bar (counts by status, ETA), then one row per measuring worker where the backend has
    several (where it runs, what it measures now, its counts), then a best-so-far table per density."""

    def __init__(self, interpreter: bool, backend: Backend):
        self.interpreter = interpreter
        self.backend = backend
        self.counts: collections.Counter = collections.Counter()
        self.progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.description}"), console=console)
        self.task = self.progress.add_task("", total=None)
        self.points: list[Any] = []
        self.current: Any = None
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> Display:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.update(self._render())
        self.live.__exit__(*exc)

    def _table(self) -> Table:
        shown = [pt for pt in self.points if pt.counts or pt.already or pt is self.current][-LIVE_POINTS:]
        rows = [(pt.problem.kernel, _point(pt.problem), str(sum(pt.counts.values()) + pt.already),
                 _ms(pt.best.time_ms if pt.best else None),
                 _ms(pt.baseline.time_ms if pt.baseline and pt.baseline.ok else None),
                 f"{pt.speedup:.2f}x" if pt.speedup else "-",
                 config_change(pt.problem.kernel, pt.best.config if pt.best else None)) for pt in shown]
        return _fitted("best so far", ("kernel", "point", "done", "best ms", "default", "speedup",
                                       "best config (vs default)"), rows,
                       ["bold" if pt is self.current else None for pt in shown])

    def _workers(self) -> Table:
        t = Table(title="workers", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("worker", "where", "now", "done", "ok", "rej", "fail", "lost"):
            t.add_column(col, justify="left" if col in ("worker", "where", "now") else "right")
        for st in self.backend.states.values():
            c = st.counts
            failed, done = sum(c[s] for s in FAILED), sum(c[s] for s in STATUS_STYLE)
            t.add_row(st.name, st.where, st.current or "-", str(done), str(c["ok"]), str(c["inaccurate"]),
                      f"[red]{failed}[/]" if failed else "0", str(c["lost"]))
        return t

    def _render(self) -> Group:
        if self.backend.states:
            return Group(self.progress, self._workers(), self._table())
        return Group(self.progress, self._table())

    def on_event(self, kind: str, **data: Any) -> None:
        if kind == "start":
            self.points = data["points"]
            self.progress.update(self.task, total=data["total"])
        elif kind == "point":
            self.current = data["point"]
        elif kind == "second_pass":  # a grid budget's second pass: more measurements where points disagree
            total = self.progress.tasks[0].total
            self.progress.update(self.task, total=(total or 0) + data["total"])
        elif kind == "result":
            self.counts[data["obs"].status] += 1
            text = " ".join(f"[{STATUS_STYLE[s]}]{s} {n}[/]" for s, n in sorted(self.counts.items()))
            self.progress.update(self.task, advance=1, description=text)
        self.live.update(self._render())


@contextlib.contextmanager
def progress(what: str, start: str = "", quiet: bool = False) -> Iterator[Callable[[int, int, str], None]]:
    """A rich progress bar fed by a tuner function's ``on_progress(done, total, label)``; ``start`` is
    shown until the first call (e.g. while data loads). Transient: on a terminal it goes when the work
    is done, and elsewhere (a pipe, a log) it prints nothing, so the command's output is the same."""
    if quiet:
        yield lambda done, total, label: None
        return
    bar = Progress(TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}"),
                   console=console, transient=True)
    task = bar.add_task(start, total=None)

    def update(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=escape(label))

    with bar:
        yield update


def summary_table(points: list[Any], interpreter: bool) -> Table:
    """One line a point, within 100 columns: candidates, what this run measured (ok / rejected / failed),
    best and default times, and the best config as its change from the default (the column that is cut
    where the line is short)."""
    rows = []
    for pt in points:
        c = pt.counts
        failed = c["compile_error"] + c["crash"] + c["timeout"] + c["invalid"]
        rows.append((pt.problem.kernel, _point(pt.problem), str(len(pt.candidates)),
                     f"{c['ok']}/{c['inaccurate']}/{failed}", _ms(pt.best.time_ms if pt.best else None),
                     _ms(pt.baseline.time_ms if pt.baseline and pt.baseline.ok else None),
                     f"{pt.speedup:.2f}x" if pt.speedup else "-",
                     config_change(pt.problem.kernel, pt.best.config if pt.best else None)))
    title = "sweep summary" + (" (interpreter: times are meaningless)" if interpreter else "")
    return _fitted(title, ("kernel", "point", "cand", "ok/rej/fail", "best ms", "default", "speedup",
                           "best config (vs default)"), rows)


def _fitted(title: str, cols: tuple[str, ...], rows: list[tuple], styles: list[str | None] | None = None
            ) -> Table:
    """A table whose columns but the last keep their full width; the last (a config) is cut to fit."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    for i, col in enumerate(cols):
        last = i == len(cols) - 1
        width = max([len(col)] + [len(str(r[i])) for r in rows])
        t.add_column(col, justify="left" if i < 2 or last else "right", no_wrap=True,
                     min_width=None if last else width, ratio=1 if last else None)
    for r, style in zip(rows, styles or [None] * len(rows), strict=True):
        t.add_row(*r, style=style)
    return t
