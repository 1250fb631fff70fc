"""``moetune sweep`` and ``moetune results`` through typer's test runner: output, store, bad input."""

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess

import crashy_spec  # noqa: F401  (registers test.crashy and test.steady)
import numpy as np
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.tuner.store import Store


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def test_sweep_then_results(cli, tmp_path):
    db = tmp_path / "r.sqlite"
    res = cli("sweep", "--kernel", "test.steady", "--model", "deepseek-v3", "--tp", "8", "--tokens", "1",
              "--strategy", "random", "--budget", "3", "--db", db)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "interpreter" in out and "times are meaningless" in out and "'tiny' model" in out
    assert "sweep summary" in out and "3 measurement(s) written" in out
    with Store(db) as s:
        rows = s.frame()
    assert list(rows["status"]) == ["ok"] * 3 and rows["strategy"].eq("random").all()
    assert rows.iloc[0]["config"] == '{"mode":"ok","v":0}'  # the default first

    again = cli("sweep", "--kernel", "test.steady", "--model", "tiny", "--tokens", "1",
                "--strategy", "random", "--budget", "3", "--db", db, "--quiet")
    assert again.exit_code == 0 and "0 measurement(s) written" in again.output  # resumed: nothing left

    csv = tmp_path / "out.csv"
    res = cli("results", "--db", db, "--kernel", "test", "--status", "ok", "--csv", csv)
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())  # rich wraps at the runner's 80 columns: long tmp paths move words
    assert "3 row(s)" in flat and "ok 3" in flat
    assert len(csv.read_text().strip().splitlines()) == 4
    res = cli("results", "--db", db, "--status", "crash")
    assert res.exit_code == 0 and "0 row(s)" in res.output
    res = cli("results", "--db", db, "--device", "some other gpu", "--limit", "0")
    assert res.exit_code == 0 and "0 row(s)" in res.output
    packed = tmp_path / "r.sqlite.gz"  # as stores are committed
    packed.write_bytes(gzip.compress(db.read_bytes()))
    res = cli("results", "--db", packed, "--status", "ok", "--limit", "0")
    assert res.exit_code == 0 and "3 row(s)" in res.output, res.output


def test_results_parquet(cli, tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add({"kernel": "k", "device_name": "d", "shape": {"E": 1}, "tokens": 1, "routes": 1,
               "active_fraction": 1.0, "routing": "uniform", "config": {"a": 1}, "status": "ok"})
    res = cli("results", "--db", db, "--parquet", tmp_path / "o.parquet")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert res.exit_code == 2 and "pyarrow" in res.output and "Traceback" not in res.output
    else:
        assert res.exit_code == 0 and (tmp_path / "o.parquet").exists()


def _trace(tmp_path):
    path = tmp_path / "trace.npy"
    np.save(path, np.zeros((4, 3), dtype=np.int64))  # top_k 3, but the tiny model routes to 2
    return path


@pytest.mark.parametrize("args, message", [
    (["--kernel", "nope", "--model", "tiny"], "unknown kernel 'nope'"),
    (["--kernel", "test.steady", "--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--kernel", "test.steady", "--model", "tiny", "--strategy", "annealing"], "unknown strategy"),
    (["--kernel", "test.steady", "--shape", "E=2,N=8,K=8,top_k=4"], "top_k 4 exceeds"),
    (["--kernel", "test.steady", "--model", "deepseek-v3", "--tp", "3"], "does not divide"),
    (["--kernel", "test.crashy", "--shape", "E=4,N=8,K=1,top_k=2"], "no candidate config passes"),
    (["--kernel", "test.steady", "--model", "tiny", "--tokens", "a,b"], "cannot parse list"),
    (["--kernel", "test.steady", "--model", "tiny", "--budget", "0"], "--budget"),
    (["--kernel", "test.steady", "--model", "tiny", "--timeout", "0"], "--timeout"),
    (["--kernel", "test.steady", "--model", "tiny", "--routing", "trace:TRACE"], "expected [tokens, 2]"),
    (["--kernel", "test.steady", "--model", "tiny", "--retry", "inaccurate"], "only crash, timeout"),
    (["--kernel", "test.steady", "--model", "tiny", "--start", "MISSING"], "cannot read a JSON config list"),
    (["--kernel", "test.steady", "--model", "tiny", "--start", "NOTJSON"], "cannot read a JSON config list"),
    (["--kernel", "test.steady", "--model", "tiny", "--start", "NUMBERS"], "expected a config object"),
])
def test_bad_input_one_line_no_store(cli, tmp_path, args, message):
    db = tmp_path / "r.sqlite"
    (tmp_path / "notjson.json").write_text("{v: 1")
    (tmp_path / "numbers.json").write_text("[1, 2]")
    files = {"TRACE": str(_trace(tmp_path)), "MISSING": str(tmp_path / "none.json"),
             "NOTJSON": str(tmp_path / "notjson.json"), "NUMBERS": str(tmp_path / "numbers.json")}
    args = [files.get(a, a.replace("TRACE", files["TRACE"])) for a in args]
    res = cli("sweep", *args, "--db", db)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert res.output.strip().startswith("error:")
    assert not db.exists()  # nothing created, nothing damaged


def test_start_configs_are_measured_first_where_the_space_holds_them(cli, tmp_path):
    """A benchmark's find, handed to the sweep: measured right after the default at every point, with
    any strategy (random takes no warm starts); a config outside a point's space (v 99) is skipped,
    keys the op lacks are dropped; they count with the budget."""
    starts = tmp_path / "starts.json"
    starts.write_text(json.dumps([{"v": 41, "BLOCK_SIZE_X": 8}, {"v": 99}, {"v": 17}]))
    db = tmp_path / "s.sqlite"
    res = cli("sweep", "--kernel", "test.steady_wide", "--model", "tiny", "--tokens", "1,2", "--strategy",
              "random", "--budget", "4", "--start", starts, "--db", db)
    assert res.exit_code == 0, res.output
    assert "--start config 2" in res.output and "in no point's space" in res.output
    assert "--start config 1 " not in res.output and "--start config 3 " not in res.output
    with Store(db) as s:
        rows = s.frame().sort_values("id")
    for tokens in (1, 2):
        order = [json.loads(c)["v"] for c in rows[rows["tokens"] == tokens]["config"]]
        assert order[1:3] == [41, 17] and 99 not in order and len(order) == 4, order


def test_coordinate_descends_from_the_start_configs_first(cli, tmp_path):
    """--start configs head the warm starts: coordinate descent measures the start's neighbours (v 40 and 42)
    right after it, before those of the heuristic (the default here, v 0)."""
    starts = tmp_path / "starts.json"
    starts.write_text(json.dumps({"v": 41}))
    db = tmp_path / "c.sqlite"
    res = cli("sweep", "--kernel", "test.steady_wide", "--model", "tiny", "--tokens", "1", "--strategy",
              "coordinate", "--budget", "5", "--start", starts, "--db", db)
    assert res.exit_code == 0, res.output
    with Store(db) as s:
        rows = s.frame().sort_values("id")
    order = [json.loads(c)["v"] for c in rows[rows["strategy"] != "remeasure"]["config"]]
    assert order[:2] == [0, 41] and set(order[2:4]) == {40, 42}, order


def test_cross_measures_the_other_points_bests_beyond_the_budget(cli, tmp_path):
    db = tmp_path / "x.sqlite"
    res = cli("sweep", "--kernel", "test.steady_wide", "--model", "tiny", "--tokens", "1,2,4", "--strategy",
              "random", "--budget", "3", "--cross", "--db", db)
    assert res.exit_code == 0, res.output
    with Store(db) as s:
        rows = s.frame().sort_values("id")
    searched = rows.groupby("tokens").head(3)  # the budget's three a point come first
    bests = set(searched.loc[searched.groupby("tokens")["time_ms"].idxmin(), "config"])
    for tokens in (1, 2, 4):
        got = rows[rows["tokens"] == tokens]["config"]
        assert got.is_unique and bests <= set(got) and len(got) <= 3 + len(bests) - 1


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00 but truncated garbage", b"hello"])
def test_foreign_database_is_left_alone(cli, tmp_path, content):
    db = tmp_path / "precious.db"
    db.write_bytes(content or b"plain text notes")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for cmd in (["sweep", "--kernel", "test.steady", "--model", "tiny", "--tokens", "1"], ["results"]):
        res = cli(*cmd, "--db", db)
        assert res.exit_code == 2 and "error:" in res.output and str(db) in res.output, res.output
        assert "Traceback" not in res.output
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_results_needs_an_existing_store(cli, tmp_path):
    res = cli("results", "--db", tmp_path / "none.sqlite")
    assert res.exit_code == 2 and "no results database" in res.output
    res = cli("results", "--db", tmp_path / "none.sqlite", "--status", "great")
    assert res.exit_code == 2


def test_full_timing_turns_the_short_readings_off(cli, tmp_path, monkeypatch):
    from moetune.tuner import factory

    seen = []
    real = factory.make_runner
    monkeypatch.setattr(factory, "make_runner", lambda **kw: seen.append(kw["timing"]) or real(**kw))
    for flag in ([], ["--full-timing"]):
        res = cli("sweep", "--kernel", "test.steady", "--model", "tiny", "--tokens", "1",
                  "--strategy", "random", "--budget", "1", "--db", tmp_path / "r.sqlite", "--quiet", *flag)
        assert res.exit_code == 0, res.output
    assert seen == [None, {"slow_ratio": 0.0}]


def test_dominated_designs_are_skipped_unless_full_space(cli, tmp_path, monkeypatch):
    """A spec's dominated designs (odd v here) stay out of the search, starts included, and the pruned
    count says so; --full-space searches them too."""
    from crashy_spec import STEADY_WIDE

    monkeypatch.setattr(STEADY_WIDE, "dominated",
                        lambda config, device, shape=None: "odd" if config["v"] % 2 else None, raising=False)
    starts = tmp_path / "starts.json"
    starts.write_text(json.dumps([{"v": 41}]))
    seen = {}
    for flag in ([], ["--full-space"]):
        db = tmp_path / f"d{len(flag)}.sqlite"
        res = cli("sweep", "--kernel", "test.steady_wide", "--model", "tiny", "--tokens", "1", "--strategy",
                  "exhaustive", "--start", starts, "--db", db, "--quiet", *flag)
        assert res.exit_code == 0, res.output
        assert ("--start config 1" in res.output) == (not flag)
        assert f"({0 if flag else 24} pruned)" in res.output
        with Store(db) as s:
            seen[bool(flag)] = sorted(json.loads(c)["v"] for c in s.frame()["config"])
    assert seen[False] == list(range(0, 48, 2)) and seen[True] == list(range(48))


def test_per_candidate_diagnostics_only_with_verbose(cli, tmp_path):
    outputs = {}
    for flag in ([], ["--verbose"]):
        res = cli("sweep", "-k", "test.steady", "-m", "tiny", "--tokens", "1", "--strategy", "random",
                  "--budget", "2", "--db", tmp_path / f"v{len(flag)}.sqlite", "--quiet", *flag)
        assert res.exit_code == 0, res.output
        outputs[bool(flag)] = res.output
    for out in outputs.values():
        assert "sweep summary" in out and "2 measurement(s) written" in out
    for line in ("start-up, s after planning began", "per candidate, median ms",
                 "tuner overhead per candidate"):
        assert line not in outputs[False] and line in outputs[True], (line, outputs[True])


def test_a_repeated_kernel_sweeps_each(cli, tmp_path):
    db = tmp_path / "r.sqlite"
    res = cli("sweep", "-k", "test.steady", "--kernel", "test.steady_wide", "-m", "tiny", "--tokens", "1",
              "--strategy", "random", "--budget", "1", "--db", db, "--quiet")
    assert res.exit_code == 0, res.output
    with Store(db) as s:
        assert sorted(s.frame()["kernel"]) == ["test.steady", "test.steady_wide"]


def _store_of(db, n=3, reason="x" * 300):
    """Rows with the longest cells a store holds: a long config and a long failure reason."""
    config = {f"KNOB_{i}": i for i in range(12)}
    with Store(db) as s:
        for i in range(n):
            s.add({"kernel": "fp8_decode.gate_up", "device_name": "NVIDIA H200", "arch": "sm_90",
                   "shape": {"E": 256}, "tokens": 1 + i, "routes": 8, "active_fraction": 0.5,
                   "routing": "zipf:1.2", "config": config, "status": "crash" if i else "ok",
                   "time_ms": None if i else 0.123456, "spread": 0.01, "roofline_frac": 0.5,
                   "reason": reason if i else None})
    return db


def test_results_fit_100_columns_one_line_a_row(cli, tmp_path, monkeypatch):
    from moetune.cli import _common

    db = _store_of(tmp_path / "r.sqlite")
    for c in (_common.console, _common.err_console):
        monkeypatch.setattr(c, "width", 100)
    res = cli("results", "--db", db)
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if "│" in line]  # the header's cells split by "┃"
    assert len(rows) == 3, res.output  # one line per row
    assert all(len(line) <= 100 for line in res.output.splitlines()), res.output
    assert "0.1235" in rows[0] and "t1 r8 a0.5 zipf:1.2" in rows[0] and "KNOB_0=0" in rows[0]
    assert all("crash" in r for r in rows[1:])
    for c in (_common.console, _common.err_console):
        monkeypatch.setattr(c, "width", 300)  # the wide view is for a wide terminal
    res = cli("results", "--db", db, "--wide")
    assert res.exit_code == 0 and "reason" in res.output and "xxxx" in res.output and "NVIDIA" in res.output


def test_results_name_an_unknown_kernel_and_take_repeated_ones(cli, tmp_path):
    db = _store_of(tmp_path / "r.sqlite", n=1)
    with Store(db) as s:  # a kernel only this store knows (a plugin not installed here) is no error
        s.add({"kernel": "mine.op", "device_name": "d", "shape": {"E": 1}, "tokens": 1, "routes": 1,
               "active_fraction": 1.0, "routing": "uniform", "config": {"a": 1}, "status": "ok"})
    res = cli("results", "--db", db, "-k", "fp9_decode")
    assert res.exit_code == 2 and "unknown kernel 'fp9_decode'" in res.output
    assert "Traceback" not in res.output
    res = cli("results", "--db", db, "-k", "fp4_prefill", "--limit", "0")  # known, none stored
    assert res.exit_code == 0 and "0 row(s)" in res.output, res.output
    res = cli("results", "--db", db, "-k", "mine.op", "-k", "fp8_decode", "--limit", "0")
    assert res.exit_code == 0 and "2 row(s)" in res.output, res.output


@contextlib.contextmanager
def _read_only(*paths):
    """Make ``paths`` unwritable for this process, root included (chattr +i where chmod does not stop
    root); skips where neither can."""
    if os.geteuid() != 0:
        modes = [p.stat().st_mode for p in paths]
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, mode in zip(paths, modes, strict=True):
                p.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", *map(str, paths)], capture_output=True).returncode:
        pytest.skip("cannot make a path read-only for root here (no chattr +i)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", *map(str, paths)], check=True)


def test_a_new_db_in_a_read_only_directory_is_one_line(cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    with _read_only(locked):
        for db in (locked / "r.sqlite", locked / "sub" / "r.sqlite"):
            res = cli("sweep", "-k", "test.steady", "-m", "tiny", "--tokens", "1", "--db", db, "--quiet")
            assert res.exit_code == 2 and "Traceback" not in res.output, res.output
            assert res.output.strip().startswith("error:") and str(db) in res.output
            assert "cannot" in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_a_store_on_read_only_media_is_read_and_not_swept_into(cli, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    db = _store_of(media / "r.sqlite", n=2)
    before = db.read_bytes()
    with _read_only(db, media):
        res = cli("results", "--db", db, "--limit", "0")
        assert res.exit_code == 0 and "2 row(s)" in res.output, res.output
        res = cli("sweep", "-k", "test.steady", "-m", "tiny", "--tokens", "1", "--db", db, "--quiet")
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert res.output.strip().startswith("error:") and str(db) in res.output and "writ" in res.output
    assert db.read_bytes() == before
