"""Progress of the long commands (replay, bench, export): a bar on a terminal, none with --quiet or in a pipe;
the tuner functions behind them report increasing counts."""

from __future__ import annotations

import re

import crashy_spec  # noqa: F401  (registers test.steady)
import pytest
from typer.testing import CliRunner

from moetune.cli import _common, app
from moetune.tables import picker
from moetune.tuner.bench import bench
from moetune.tuner.replay import load_points, replay

DATA = "tests/data/toy_landscape.csv.gz"


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def terminal(monkeypatch):
    """The CLI's console believes it writes to a terminal (where rich draws a progress bar)."""
    monkeypatch.setattr(_common.console, "_force_terminal", True)
    monkeypatch.setattr(_common.console, "is_interactive", True)
    monkeypatch.setenv("TERM", "xterm-256color")  # not a dumb one, where rich draws no live display


@pytest.fixture
def no_tables(tmp_path, monkeypatch):
    monkeypatch.setenv(picker.ENV_VAR, str(tmp_path / "configs"))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    yield tmp_path / "configs"
    picker.clear_cache()


def _plain(text: str) -> str:
    """Output without terminal control codes, words split by single spaces (rich wraps lines)."""
    return " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).split())


def _counts_increase(calls: list[tuple[int, int, str]], total: int) -> None:
    dones = [d for d, _, _ in calls]
    assert dones == list(range(total + 1)), dones  # one call before each item, one after the last
    assert all(t == total for _, t, _ in calls) and calls[-1][2] == ""
    assert all(label for *_, label in calls[:-1])


def test_replay_reports_each_strategy_budget_seed_and_point():
    points = load_points(DATA)
    calls: list[tuple[int, int, str]] = []
    replay(points, ["coordinate", "random"], ["10%"], seeds=2, on_progress=lambda *a: calls.append(a))
    _counts_increase(calls, 2 * 2 * len(points))
    assert calls[0][2].startswith("coordinate 10% seed 0: ") and points[0].label in calls[0][2]


def test_bench_reports_each_point(no_tables):
    calls: list[tuple[int, int, str]] = []
    bench(["test.steady"], model="tiny", tokens=[1, 2], on_progress=lambda *a: calls.append(a))
    _counts_increase(calls, 2)
    assert calls[0][2] == "test.steady t1 r2" and calls[1][2] == "test.steady t2 r4"


def test_replay_progress_on_a_terminal_only_and_never_with_quiet(cli, terminal):
    args = ("replay", "--data", DATA, "--strategy", "random", "--budget", "10%", "--seeds", "2")
    shown, quiet = cli(*args), cli(*args, "--quiet")
    assert shown.exit_code == 0 and quiet.exit_code == 0, shown.output + quiet.output
    assert f"reading {DATA}" in shown.output and "4/4" in shown.output  # the bar: loading, then counting
    assert "reading" not in quiet.output and "4/4" not in quiet.output
    assert "replay: 2 point(s), 2 seed(s), batch 1" in quiet.output  # the tables are the same


def test_replay_in_a_pipe_prints_no_progress(cli):
    res = cli("replay", "--data", DATA, "--strategy", "random", "--budget", "10%", "--seeds", "1")
    assert res.exit_code == 0 and "reading" not in res.output and "\x1b[" not in res.output


def test_bench_progress_and_quiet(cli, terminal, no_tables):
    args = ("bench", "-k", "test.steady", "-m", "tiny", "--tokens", "1,2")
    shown, quiet = cli(*args), cli(*args, "--quiet")
    assert shown.exit_code == 0 and quiet.exit_code == 0, shown.output + quiet.output
    assert "starting the workers" in shown.output and "2/2" in shown.output
    assert "starting the workers" not in quiet.output and "2/2" not in quiet.output
    assert "Triton interpreter" in _plain(quiet.output) and "default" in _plain(quiet.output)  # the table


def test_export_progress_and_quiet(cli, terminal, tmp_path, no_tables):
    db = tmp_path / "r.sqlite"
    res = cli("sweep", "-k", "test.steady", "-m", "tiny", "--tokens", "1", "--strategy", "random", "--budget",
              "2", "--db", db, "--quiet")
    assert res.exit_code == 0, res.output
    shown = cli("export", "--db", db, "--out", tmp_path / "a")
    quiet = cli("export", "--db", db, "--out", tmp_path / "b", "--quiet")
    assert shown.exit_code == 0 and quiet.exit_code == 0, shown.output + quiet.output
    assert "reading the store(s)" in shown.output and "1/1" in shown.output
    assert "reading the store(s)" not in quiet.output and "1/1" not in quiet.output
    assert _plain(quiet.output).count(": 1 added") == 2  # the device's table and the arch's


def test_the_sweep_summary_fits_100_columns_and_shows_the_change_from_the_default():
    from types import SimpleNamespace

    from rich.console import Console

    from moetune.cli.display import summary_table
    from moetune.kernels.rules import get_rules

    default = dict(get_rules("fp8_decode.gate_up").default)
    best = SimpleNamespace(config={**default, "BLOCK_SIZE_N": 128, "SPLIT_K": 4}, time_ms=0.0123, ok=True)
    base = SimpleNamespace(config=default, time_ms=0.0456, ok=True)
    counts = {"ok": 30, "inaccurate": 1, "compile_error": 0, "crash": 1, "timeout": 0, "invalid": 0}
    problem = SimpleNamespace(kernel="fp8_decode.gate_up", tokens=64, routes=256, active_fraction=0.5,
                              routing="zipf:1.2")
    pt = SimpleNamespace(problem=problem, candidates=[None] * 4524, counts=counts, best=best, baseline=base,
                         speedup=0.0456 / 0.0123)
    console = Console(width=100, record=True)
    console.print(summary_table([pt, pt], interpreter=False))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    row = next(line for line in lines if "fp8_decode.gate_up" in line)
    # every number whole, the config as its change from the default
    for cell in ("t64 r256 a0.5 zipf:1.2", "4524", "30/1/1", "0.0123", "0.0456", "3.71x", "BN128 SK4"):
        assert cell in row, (cell, row)
