"""The Python tuning API: ``moetune.tune`` and ``moetune.export_tables`` on a test spec (interpreter)."""

from __future__ import annotations

import json

import crashy_spec  # noqa: F401  (registers test.steady)
import pytest

import moetune
from moetune.tables import picker
from moetune.tuner.api import BestConfig, SweepResult
from moetune.tuner.store import Store


@pytest.fixture
def own_tables(tmp_path, monkeypatch):
    """The picker sees only ``tmp_path / "configs"`` (MOETUNE_CONFIG_DIR), none of the shipped tables."""
    root = tmp_path / "configs"
    monkeypatch.setenv(picker.ENV_VAR, str(root))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    yield root
    picker.clear_cache()


def test_tune_then_export_tables_the_picker_reads(tmp_path, own_tables):
    db = tmp_path / "r.sqlite"
    events: list[str] = []
    result = moetune.tune(model="tiny", kernels="test.steady", tokens=[1, 2], strategy="random", budget=3,
                          db=db, on_event=lambda kind, **_: events.append(kind))
    assert isinstance(result, SweepResult) and result.db == db and not result.timed_out
    rows = result.rows
    assert len(rows) == 6 == result.written and rows["status"].eq("ok").all()
    assert rows["sweep_id"].eq(result.sweep_id).all() and sorted(set(rows["tokens"])) == [1, 2]
    with Store(db) as s:
        assert len(s.frame()) == 6
    assert events[0] == "start" and events.count("result") == 6 and events[-1] == "done"
    assert [b.tokens for b in result.best] == [1, 2]
    for best in result.best:
        assert isinstance(best, BestConfig) and best.kernel == "test.steady"
        here = rows[rows["tokens"] == best.tokens]
        fastest = here.loc[here["time_ms"].idxmin()]
        assert best.time_ms == fastest["time_ms"] and best.config == json.loads(fastest["config"])
        assert best.default_ms == here.iloc[0]["time_ms"]  # the default measured first

    again = moetune.tune(model="tiny", kernels=["test.steady"], tokens=[1, 2], strategy="random", budget=3,
                         db=db)
    assert again.rows.empty and again.written == 0 and again.best == result.best  # resumed from the store

    progress: list[tuple[int, int, str]] = []
    out = moetune.export_tables(db, out=own_tables, on_progress=lambda *a: progress.append(a))
    assert not out.problems and len(out.files) == 2  # the device's table and the arch's
    dones = [d for d, _, _ in progress]
    assert dones == sorted(dones) and dones[0] == 0 and dones[-1] == progress[-1][1] == 1
    device = rows["device_name"].iloc[0]
    for best in result.best:
        pick = picker.pick_config_with_source("test.steady", best.shape, best.routes, device=device)
        assert pick.source == "device" and dict(pick.config) == best.config


def test_tune_checks_its_input_before_touching_the_store(tmp_path):
    db = tmp_path / "r.sqlite"
    for kwargs, message in (({"budget": 0}, "--budget"), ({"strategy": "annealing"}, "unknown strategy"),
                            ({"kernels": "nope"}, "unknown kernel 'nope'"),
                            ({"time_limit": -1}, "--time-limit")):
        with pytest.raises(ValueError, match=message):
            moetune.tune(**{"model": "tiny", "kernels": "test.steady", "tokens": 1, "db": db, **kwargs})
    assert not db.exists()


def test_export_tables_keeps_interpreter_rows_out_of_the_packaged_tables(tmp_path, monkeypatch, own_tables,
                                                                          capsys):
    packaged = tmp_path / "packaged"
    monkeypatch.setattr(picker, "PACKAGED", packaged)
    db = tmp_path / "r.sqlite"
    moetune.tune(model="tiny", kernels="test.steady", tokens=1, strategy="random", budget=2, db=db,
                 quiet=False)
    err = capsys.readouterr().err  # not quiet: plain lines on stderr
    assert "1 point(s), about 2 measurement(s)" in err and "2/2 measured" in err and "best " in err
    with pytest.raises(ValueError, match="--allow-interpreter"):
        moetune.export_tables(db)
    assert not packaged.exists()
    assert moetune.export_tables(db, allow_interpreter=True).files and packaged.exists()
