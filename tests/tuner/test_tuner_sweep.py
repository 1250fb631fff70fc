"""End-to-end sweeps through the interpreter: every built-in op, crash isolation, resume, two writers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import crashy_spec  # noqa: F401  (registers test.crashy and test.steady)
import pandas as pd
import pytest

from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import all_specs
from moetune.tuner.backends.process import Runner
from moetune.tuner.store import STATUSES, Store
from moetune.tuner.sweep import Sweep

TESTS = Path(__file__).parent.parent  # crashy_spec lives there
BUILTIN = [s.name for s in all_specs() if type(s).__module__.startswith("moetune.specs.")]
CLI = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import crashy_spec; "
       "from moetune.cli import main; main()")


def sweep(db, kernel, tokens, *, jobs=0, timeout=30.0, **kw):
    spec = next(s for s in all_specs() if s.name == kernel)
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in tokens]
    with Store(db) as store, Runner(timeout=timeout, jobs=jobs) as runner:
        points = Sweep(store, runner, **kw).run(problems)
        return points, store.frame()


@pytest.mark.parametrize("kernel", BUILTIN)
def test_each_builtin_op_sweeps_in_the_interpreter(tmp_path, kernel):
    # The default plus one random candidate: the interpreter takes seconds per GEMM run.
    budget = 2 if kernel == "gather_rows" else 1
    points, rows = sweep(tmp_path / "r.sqlite", kernel, [1], strategy="random", budget=budget, seed=1)
    spec = points[0].spec
    assert len(rows) == budget and rows["config"].nunique() == budget
    assert set(rows["status"]) <= set(STATUSES)
    first = rows.iloc[0]
    assert json.loads(first["config"]) == spec.default  # the shipped default, measured first
    assert first["status"] == "ok", first["reason"]
    ok = rows[rows["status"] == "ok"]
    assert (ok["time_ms"] > 0).all() and (ok["n_runs"] >= 1).all()
    assert (ok["error"] == 0).all() if spec.exact else (ok["error"] <= spec.tolerance).all()
    assert (rows["arch"] == "interpreter").all() and (rows["bytes"] > 0).all()
    assert points[0].baseline is not None and points[0].best is not None


EXPECTED = {"ok": "ok", "wrong": "inaccurate", "raise": "crash", "refuse": "invalid",
            "compile": "compile_error", "abort": "crash", "segv": "crash", "hang": "timeout"}


@pytest.mark.parametrize("jobs, batch", [(0, 64), (1, 64), (2, 3)],
                         ids=["measure-stage", "compile-stage", "compile-ahead"])
def test_crash_isolation(tmp_path, jobs, batch):
    # batch 3: each batch is measured while the compile workers build the next one
    points, rows = sweep(tmp_path / "r.sqlite", "test.crashy", [2], jobs=jobs, timeout=3.0,
                         strategy="exhaustive", batch=batch)
    records = [{**r, **json.loads(r["config"])} for r in rows.to_dict("records")]
    got = {r["mode"]: r for r in records if r["v"] == 0}
    assert {m: r["status"] for m, r in got.items()} == EXPECTED
    assert len(rows) == len(points[0].candidates) == 10  # 3 ok variants + 7 failing modes, 20 pruned
    assert points[0].pruned == 20
    assert "SIGABRT" in got["abort"]["reason"] and "SIGSEGV" in got["segv"]["reason"]
    assert "no result within" in got["hang"]["reason"]
    assert pd.isna(got["wrong"]["time_ms"]) and got["wrong"]["error"] > 0.1  # rejected, never timed
    compiled = {m for m, r in got.items() if str(r["reason"]).startswith("while compiling")}
    assert compiled == ({"raise", "refuse", "compile", "abort", "segv", "hang"} if jobs else set())
    assert (rows[rows["status"] == "ok"]["time_ms"] > 0).all() and (rows["status"] == "ok").sum() == 3
    assert points[0].best.ok


def _cli(db, *args, sleep="0"):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CRASHY_SLEEP": sleep}
    cmd = [sys.executable, "-c", CLI, str(TESTS), "sweep", "--kernel", "test.steady", "--model", "tiny",
           "--tokens", "1", "--strategy", "exhaustive", "--db", str(db), "--quiet", *args]
    # A test process may have inherited or set SIGINT to "ignore"; an ignored signal stays ignored
    # across exec, and this CLI must see Ctrl-C as a user's shell would deliver it.
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_rows(db, n, proc, limit=120):
    t0 = time.time()
    while time.time() - t0 < limit:
        if db.exists():
            with Store(db) as s:
                if s.count() >= n:
                    return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    raise AssertionError("sweep made no progress")


def _each_once(db):
    with Store(db) as s:
        rows = s.frame()
    keys = list(zip(rows["tokens"], rows["config"], strict=True))
    assert len(keys) == len(set(keys)) == 6  # every config exactly once
    return rows


def test_ctrl_c_then_sigkill_then_resume(tmp_path):
    db = tmp_path / "r.sqlite"
    proc = _cli(db, sleep="1.0")  # ~10 s of candidates left after the first row: Ctrl-C lands mid-sweep
    _wait_rows(db, 1, proc)       # even on a loaded 2-core machine
    proc.send_signal(signal.SIGINT)  # Ctrl-C: stops cleanly, keeps what it measured
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out and "Traceback" not in out, \
        f"SIGINT here: {signal.getsignal(signal.SIGINT)}\n{out}"
    with Store(db) as s:
        n = s.count()
    proc = _cli(db, sleep="0.4")
    _wait_rows(db, n + 1, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    with Store(db) as s:
        before = s.frame()
    assert 2 <= len(before) < 6
    again = _cli(db)
    out, _ = again.communicate(timeout=240)
    assert again.returncode == 0, out
    rows = _each_once(db)
    kept = rows[rows["id"].isin(before["id"])]
    assert kept.equals(before)  # nothing measured before the kill was lost or redone
    assert rows["sweep_id"].nunique() == 3


def test_two_sweeps_on_one_store(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db):
        pass  # both start from an existing store
    a, b = _cli(db, sleep="0.3"), _cli(db, sleep="0.3")
    for p in (a, b):
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
    rows = _each_once(db)
    assert set(rows["status"]) == {"ok"}
    with Store(db) as s:  # every claim was released
        assert s._conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0


def test_rerun_measures_nothing_new(tmp_path):
    db = tmp_path / "r.sqlite"
    spec = crashy_spec.STEADY
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), 1)]
    with Store(db) as store, Runner(timeout=30) as runner:
        first = Sweep(store, runner, strategy="exhaustive").run(problems)
        again = Sweep(store, runner, strategy="exhaustive").run(problems)
        rows = store.frame()
    assert len(rows) == 6 and sum(again[0].counts.values()) == 0 and again[0].already == 6
    assert canonical_json(again[0].best.config) == canonical_json(first[0].best.config)


def test_retry_measures_failed_candidates_again_and_keeps_their_rows(tmp_path):
    db = tmp_path / "r.sqlite"
    spec = crashy_spec.STEADY
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), 1)]
    with Store(db) as store, Runner(timeout=30) as runner:
        Sweep(store, runner, strategy="exhaustive").run(problems)
        store._conn.execute("UPDATE measurements SET status = 'crash', time_ms = NULL WHERE id IN (2, 3)")
        store._conn.commit()  # as if two had run the GPU out of memory
        plain = Sweep(store, runner, strategy="exhaustive").run(problems)
        again = Sweep(store, runner, strategy="exhaustive", retry=["crash"]).run(problems)
        after = Sweep(store, runner, strategy="exhaustive", retry=["crash"]).run(problems)
        rows = store.frame()
    assert sum(plain[0].counts.values()) == 0  # without --retry a crash row counts as measured
    assert again[0].counts == {"ok": 2} and sum(after[0].counts.values()) == 0
    assert len(rows) == 8 and (rows["status"] == "crash").sum() == 2  # nothing lost
    assert rows[rows["status"] == "ok"]["config"].nunique() == 6
    with pytest.raises(ValueError, match="only crash, timeout, compile_error"):
        Sweep(store, runner, retry=["inaccurate"])


def test_a_key_added_to_the_space_later_keeps_old_rows_measured(tmp_path, monkeypatch):
    db = tmp_path / "r.sqlite"
    spec = crashy_spec.STEADY
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), 1)]
    with Store(db) as store, Runner(timeout=30) as runner:
        Sweep(store, runner, strategy="exhaustive").run(problems)
        # the kernel grew a switch whose default is what ran before: old rows count as that default
        monkeypatch.setattr(spec, "space", {**spec.space, "x": (0,)})
        monkeypatch.setattr(spec, "default", {**spec.default, "x": 0})
        again = Sweep(store, runner, strategy="exhaustive").run(problems)
        rows = store.frame()
    assert len(rows) == 6 and sum(again[0].counts.values()) == 0
    assert again[0].baseline is not None and again[0].baseline.config["x"] == 0


def test_measurements_left_queued_by_a_stopped_caller_never_start(tmp_path):
    """A sweep that stops reading (time limit) leaves measurements queued; their admit callbacks
    belong to it (its store may be closed by now), so the next call must not start them."""
    spec = crashy_spec.STEADY_WIDE
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 1)
    configs = [{**spec.default, "v": v} for v in range(12)]
    asked = []
    with Runner(timeout=30) as runner:
        first = runner.measure(spec, problem, configs[:8], admit=lambda c: asked.append(c["v"]) or True)
        next(first)
        first.close()  # the caller stopped reading, as a sweep at its time limit does
        before = len(asked)
        done = [c["v"] for c, res in runner.measure(spec, problem, configs[8:]) if res["status"] == "ok"]
    assert before < 8 and len(asked) == before
    assert sorted(done) == [8, 9, 10, 11]


@pytest.mark.parametrize("strategy", ["model", "coordinate"])
def test_the_heuristic_is_measured_at_every_point(tmp_path, monkeypatch, strategy):
    """The table a sweep exports replaces the heuristic, so the heuristic's config must be a candidate."""
    spec = crashy_spec.STEADY_WIDE
    monkeypatch.setattr(spec, "heuristic", lambda shape, routes, arch: {**spec.default, "v": 37})
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in (1, 2)]
    with Store(tmp_path / "h.sqlite") as store, Runner(timeout=30) as runner:
        Sweep(store, runner, strategy=strategy, budget=4).run(problems)
        rows = store.frame()
    for tokens in (1, 2):
        measured = {json.loads(c)["v"] for c in rows[rows["tokens"] == tokens]["config"]}
        assert 37 in measured and len(measured) <= 4


def test_other_ops_of_a_path_warm_start_each_other_at_the_same_density(tmp_path):
    """test.steady and test.steady_wide are two ops of one path ("test"): what one found at a density is
    a hint for the other there (as its candidate), not at other densities. The same op's winners at
    other densities follow (this sweep's, then the store's)."""
    from moetune.tuner.sweep import as_sibling_hint, full_config

    shape = crashy_spec.STEADY.shape_from_model(get_model("tiny"))
    problems = [crashy_spec.STEADY.problem(shape, 1), crashy_spec.STEADY_WIDE.problem(shape, 1),
                crashy_spec.STEADY_WIDE.problem(shape, 2)]
    with Store(tmp_path / "s.sqlite") as store, Runner(timeout=30) as runner:
        sw = Sweep(store, runner, strategy="random", budget=3)
        points = sw.run(problems)
        at_1, at_2 = sw._hints(1), sw._hints(2)
    wide = crashy_spec.STEADY_WIDE
    heuristic_1, heuristic_2 = (full_config(wide, wide.heuristic(shape, pt.problem.routes, sw.device.arch))
                                for pt in points[1:])
    sibling = as_sibling_hint(wide, points[0].best.config)
    # (hints are offered once each: on the interpreter these bests may well coincide)
    assert sibling in at_1 and points[2].best.config in at_1  # tokens 2's best: from the store
    if points[2].best.config != heuristic_1:  # the heuristic comes first, the sibling before the store
        assert at_1.index(sibling) <= at_1.index(points[2].best.config)
    assert points[1].best.config in at_2  # the same op's winner at tokens 1
    assert sibling not in at_2 or sibling in (heuristic_2, points[1].best.config)  # no sibling across


def test_cross_measures_each_points_best_at_the_other_points(tmp_path):
    """--cross: after the search, every point of an op and shape measures the other points' bests that it
    has not measured (those in its space), and nothing else; a second pass measures nothing."""
    spec = crashy_spec.STEADY_WIDE
    problems = [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in (1, 2, 4)]
    with Store(tmp_path / "c.sqlite") as store, Runner(timeout=30) as runner:
        sw = Sweep(store, runner, strategy="random", budget=3, seed=1)
        bests = {canonical_json(pt.best.config) for pt in sw.run(problems)}  # before: cross moves them
        searched = store.frame()
        sw.cross()
        rows = store.frame()
        again = Sweep(store, runner, strategy="random", budget=3, seed=1)
        again.plan(problems, runner.device)
        again.run()
        again.cross()
        assert len(store.frame()) == len(rows)
    had = set(zip(searched["tokens"], searched["config"], strict=True))
    added = list(zip(rows["tokens"], rows["config"], strict=True))[len(searched):]
    assert len(added) == len(set(added))
    assert set(added) == {(t, b) for t in (1, 2, 4) for b in bests} - had
