"""The sweep's live display with one row per measuring worker (``--gpus`` / ``--ray``)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table

from moetune.cli.sweep import STATUS_STYLE, Display

FAILED = ("compile_error", "crash", "timeout", "invalid")


class WorkerDisplay(Display):
    """Progress bar, then per-worker rows (where it runs, what it measures now, its counts), then the
    best-so-far table."""

    def __init__(self, interpreter: bool, backend: Any):
        self.backend = backend  # before Display.__init__, which renders once
        super().__init__(interpreter)

    def _workers(self) -> Table:
        t = Table(title="workers", title_justify="left", show_edge=False, pad_edge=False)
        for col in ("worker", "where", "now", "done", "ok", "rej", "fail", "lost"):
            t.add_column(col, justify="left" if col in ("worker", "where", "now") else "right")
        for st in getattr(self.backend, "states", {}).values():
            c = st.counts
            failed, done = sum(c[s] for s in FAILED), sum(c[s] for s in STATUS_STYLE)
            t.add_row(st.name, st.where, st.current or "-", str(done), str(c["ok"]), str(c["inaccurate"]),
                      f"[red]{failed}[/]" if failed else "0", str(c["lost"]))
        return t

    def _render(self) -> Group:
        return Group(self.progress, self._workers(), self._table())
