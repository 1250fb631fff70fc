"""Faults that are the point's, not a candidate's (a spec whose reference or input maker raises), and a
budget shared by cooperating sweeps on one store."""

import collections
import os
import subprocess
import sys
from pathlib import Path

import crashy_spec
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.device import INTERPRETER
from moetune.models import get_model
from moetune.tuner import worker
from moetune.tuner.backends.process import Runner
from moetune.tuner.parallel import ParallelSweep
from moetune.tuner.store import Store
from moetune.tuner.sweep import Sweep

TESTS = Path(__file__).parent.parent  # crashy_spec lives there
CLI = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import crashy_spec; "
       "from moetune.cli import main; main()")


def _problems(tokens=(1,)):
    spec = crashy_spec.BAD_REFERENCE
    return [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in tokens]


class InProcessBackend:
    """A pool backend whose workers are :func:`worker.handle` in this process (the interpreter)."""

    def __init__(self, n=2):
        self.workers = [f"w{i}" for i in range(n)]
        self.device, self.versions, self.timeout, self.timing = INTERPRETER, {}, 5.0, {}
        self.queue = collections.deque()

    def start(self):
        pass

    def capacity(self):
        return len(self.workers) - len(self.queue)

    def submit(self, key, task, label=""):
        self.queue.append((key, task))

    def poll(self):
        key, task = self.queue.popleft()
        return [(key, worker.handle(task, INTERPRETER), self.workers[0])]


@pytest.mark.parametrize("stage", ["reference", "make_inputs", "make_weights"])
def test_a_failing_spec_stops_the_point_and_stores_nothing(tmp_path, monkeypatch, stage):
    monkeypatch.setenv("FAULTY_STAGE", stage)
    monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())  # weights are made once per worker
    with Store(tmp_path / "r.sqlite") as store:
        points = ParallelSweep(store, InProcessBackend(), strategy="exhaustive").run(_problems((1, 2)))
        assert store.count() == 0  # nothing stored against the configs: none is to blame
        assert store._conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0
        for pt in points:
            assert pt.failure and "test.bad_reference" in pt.failure and pt.problem.describe() in pt.failure
            assert f"{stage} failed: ValueError: {stage} broke" in pt.failure
        monkeypatch.delenv("FAULTY_STAGE")  # the spec is fixed: the next run measures every candidate
        monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())
        points = ParallelSweep(store, InProcessBackend(), strategy="exhaustive").run(_problems((1, 2)))
        assert store.count() == 12 and set(store.frame()["status"]) == {"ok"}
        assert not any(pt.failure for pt in points)


def test_a_failing_reference_stops_the_sequential_sweep_point_too(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTY_STAGE", "reference")  # the spawned worker inherits it
    with Store(tmp_path / "r.sqlite") as store, Runner(timeout=30.0, jobs=0) as runner:
        points = Sweep(store, runner, strategy="exhaustive").run(_problems())
        assert store.count() == 0
    assert "reference failed: ValueError: reference broke" in points[0].failure


def test_the_cli_says_the_reference_failed_and_exits_non_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTY_STAGE", "reference")
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["sweep", "-k", "test.bad_reference", "-m", "tiny", "--tokens", "1",
                                   "--db", str(db), "--quiet"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "point stopped" in res.output and "reference failed: ValueError: reference broke" in res.output
    with Store(db) as store:
        assert store.count() == 0


def _cli(db, *args):
    env = {**os.environ, "TRITON_INTERPRET": "1", "CRASHY_SLEEP": "0.3"}
    cmd = [sys.executable, "-c", CLI, str(TESTS), "sweep", "--kernel", "test.steady", "--model", "tiny",
           "--tokens", "1", "--db", str(db), "--quiet", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_sweeps_with_a_budget_measure_no_more_than_it_together(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db):
        pass
    procs = [_cli(db, "--strategy", "random", "--budget", "3", "--seed", str(i)) for i in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
    with Store(db) as store:
        rows = store.frame()
    assert rows["config"].nunique() == len(rows) <= 3, rows[["sweep_id", "config"]]
