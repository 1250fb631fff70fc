"""Storage faults: a disk that fills mid-sweep and a damaged store are one clear line each."""

import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import crashy_spec  # noqa: F401  (registers test.steady)
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.tuner.store import Store

TESTS = Path(__file__).parent.parent  # crashy_spec lives there
CLI = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import crashy_spec; "
       "from moetune.cli import main; main()")


def test_a_full_disk_mid_sweep_keeps_what_was_written_and_says_so(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db):
        pass
    limit = db.stat().st_size + 32_000  # a few rows' worth of write-ahead log, then "file too large"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200"}
    cmd = [sys.executable, "-c", CLI, str(TESTS), "sweep", "-k", "test.steady", "-m", "tiny",
           "--tokens", "1,2,4,8,16,32", "--strategy", "exhaustive", "--db", str(db), "--quiet"]
    res = subprocess.run(cmd, env=env, preexec_fn=small_files, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "Traceback" not in out, out
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: cannot write to results database"), out
    assert str(db) in errors[0] and "kept" in errors[0]
    with Store(db) as store:
        kept = store.count()
    assert 0 < kept < 36 and f"{kept} measurement(s) written to {db}" in res.stdout, out  # the summary


def test_a_store_missing_a_column_is_refused_at_open(tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db):
        pass
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE measurements DROP COLUMN roofline_frac")
    with pytest.raises(ValueError, match="no column roofline_frac"):
        Store(db)
    with pytest.raises(ValueError, match="no column roofline_frac"):
        Store(db, readonly=True)
    runner = CliRunner()
    for args in (["results", "--db", str(db)],
                 ["sweep", "-k", "test.steady", "-m", "tiny", "--tokens", "1", "--db", str(db), "--quiet"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert res.output.strip().startswith("error:") and "roofline_frac" in res.output
