"""The results store: schema, append-only rows, resume key, foreign files refused, concurrent writers."""

import hashlib
import multiprocessing as mp
import os
import sqlite3
import time

import pytest

from moetune.tuner.store import COLUMN_NAMES, Store

POINT = {"kernel": "k.op", "device_name": "dev", "shape": {"E": 4, "N": 8, "K": 16, "top_k": 2},
         "tokens": 3, "routes": 6, "active_fraction": 1.0, "routing": "uniform"}


def row(config, status="ok", **extra):
    return {**POINT, "config": config, "status": status, **extra}


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_store_has_schema_and_meta(tmp_path):
    path = tmp_path / "sub" / "r.sqlite"
    with Store(path):
        pass
    conn = sqlite3.connect(path)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(measurements)")]
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    assert tuple(cols) == COLUMN_NAMES
    assert meta == {"schema": "moetune-results", "version": "1"}
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_add_frame_and_resume_key(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        a = s.add(row({"b": 2, "a": 1}, time_ms=0.5))
        b = s.add(row('{"a": 3, "b": 2}', status="crash", reason="boom"))
        s.add({**row({"a": 1, "b": 2}), "tokens": 4})  # another point
        assert b == a + 1
        got = s.measured_configs("k.op", "dev", '{"top_k":2,"K":16,"N":8,"E":4}', 3, 6, 1.0, "uniform")
        assert got == {'{"a":1,"b":2}', '{"a":3,"b":2}'}
        f = s.frame(status="crash")
        assert list(f["reason"]) == ["boom"] and f["timestamp"].str.endswith("+00:00").all()
        assert s.count() == 3 and s.count(tokens=4) == 1
    with Store(tmp_path / "r.sqlite", create=False) as s:  # reopening keeps every row
        assert s.count() == 3


@pytest.mark.parametrize("bad", [{"status": "great"}, {"colour": "red"}])
def test_add_rejects_bad_rows(tmp_path, bad):
    with Store(tmp_path / "r.sqlite") as s:
        with pytest.raises(ValueError):
            s.add({**row({"a": 1}), **bad})
        assert s.count() == 0


def test_unknown_filter_column(tmp_path):
    with Store(tmp_path / "r.sqlite") as s, pytest.raises(ValueError, match="colour"):
        s.frame(colour="red")


def test_missing_file_without_create(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.sqlite"):
        Store(tmp_path / "nope.sqlite", create=False)
    assert not (tmp_path / "nope.sqlite").exists()


def _foreign_sqlite(path):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.execute("INSERT INTO people VALUES ('ada')")
    conn.commit()
    conn.close()


def _wrong_version(path):
    with Store(path):
        pass
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'version'")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"just some text, not a database at all"), "not SQLite"),
    (_foreign_sqlite, "not a moetune results database"),
    (_wrong_version, "version '99'"),
])
def test_foreign_files_are_refused_untouched(tmp_path, make, message):
    path = tmp_path / "x.db"
    make(path)
    before = digest(path)
    with pytest.raises(ValueError, match=message) as e:
        Store(path)
    assert str(path) in str(e.value)
    assert digest(path) == before


def _writer(path, worker, n):
    with Store(path) as s:
        for i in range(n):
            s.add(row({"w": worker, "i": i}))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 60)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store(path) as s:
        f = s.frame()
    assert len(f) == 120 and f["config"].nunique() == 120


def _claim_as(path, pid, expires_in):
    conn = sqlite3.connect(path)
    conn.execute("UPDATE claims SET pid = ?, expires = ?", (pid, time.time() + expires_in))
    conn.commit()
    conn.close()


def test_claims(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as s:
        assert s.claim(POINT, {"x": 1}, ttl=60)
        _claim_as(path, os.getppid(), 60)  # now held by another live process
        assert not s.claim(POINT, {"x": 1}, ttl=60)
        _claim_as(path, os.getppid(), -1)  # ... whose claim expired
        assert s.claim(POINT, {"x": 1}, ttl=60)
        _claim_as(path, 2**22 + 12345, 60)  # ... held by a process that died
        assert s.claim(POINT, {"x": 1}, ttl=60)
        s.add(row({"x": 1}))
        s.release(POINT, {"x": 1})
        assert not s.claim(POINT, {"x": 1}, ttl=60)  # stored: never measured again


def test_a_claim_finds_its_candidate_by_index_in_old_stores_too(tmp_path):
    """Whether a candidate is stored is an index lookup on (point, config), not a scan of its point:
    an exhaustive sweep claims every one of 10^4 candidates at one point."""
    path = tmp_path / "r.sqlite"
    with Store(path) as s:
        s.add(row({"x": 1}))
    with sqlite3.connect(path) as conn:  # a store made before the index had the config column
        conn.execute("DROP INDEX measurements_candidate")
        conn.execute("CREATE INDEX measurements_point ON measurements (kernel, device_name, shape, tokens, "
                     "routes, routing)")
    with Store(path) as s:
        where, params = s._where({**POINT, "config": {"x": 1}})
        plan = " ".join(str(r) for r in s._conn.execute(
            f"EXPLAIN QUERY PLAN SELECT 1 FROM measurements{where} LIMIT 1", params))
        assert "measurements_candidate" in plan and "config=?" in plan
        assert not s.claim(POINT, {"x": 1}, ttl=60) and s.claim(POINT, {"x": 2}, ttl=60)
    names = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "measurements_point" not in names


def test_a_retry_claims_configs_stored_only_as_those_failures(tmp_path):
    with Store(tmp_path / "r.sqlite") as s:
        s.add(row({"x": 1}, status="crash"))
        s.add(row({"x": 2}, status="timeout"))
        s.add(row({"x": 3}, status="crash"))
        s.add(row({"x": 3}))  # crashed once, measured since
        assert not s.claim(POINT, {"x": 1}, ttl=60)  # a plain rerun: stored is stored
        assert s.claim(POINT, {"x": 1}, ttl=60, retry={"crash"})
        assert not s.claim(POINT, {"x": 2}, ttl=60, retry={"crash"})
        assert s.claim(POINT, {"x": 2}, ttl=60, retry={"crash", "timeout"})
        assert not s.claim(POINT, {"x": 3}, ttl=60, retry={"crash"})


def test_readonly_open_changes_nothing(tmp_path):
    path = tmp_path / "r.sqlite"
    with Store(path) as s:
        s.add(row({"a": 1}))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE claims")  # a store from before claims existed
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.commit()
    conn.close()
    before = digest(path)
    with Store(path, readonly=True) as s:
        assert len(s.frame()) == 1
        with pytest.raises(ValueError, match="read-only"):
            s.add(row({"a": 2}))
    assert digest(path) == before
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "none.sqlite", readonly=True)
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        Store(tmp_path / "empty.sqlite", readonly=True)


def test_a_gzipped_store_reads_as_the_store(tmp_path):
    """Stores are committed gzipped: read_frame (export, results, replay) reads them as they are; a file
    that is not gzip names the option."""
    import gzip

    from moetune.tuner.store import read_frame

    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(row({"BLOCK_SIZE_N": 16}))
        s.add(row({"BLOCK_SIZE_N": 32}, status="crash", reason="SIGSEGV"))
    packed = tmp_path / "r.sqlite.gz"
    packed.write_bytes(gzip.compress(db.read_bytes()))
    plain, unpacked = read_frame(db), read_frame(packed, "--db")
    assert len(unpacked) == 2 and plain.equals(unpacked)
    (tmp_path / "bad.sqlite.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="--db: cannot read .*bad.sqlite.gz as a gzipped store"):
        read_frame(tmp_path / "bad.sqlite.gz", "--db")
    with pytest.raises(FileNotFoundError, match="--db"):
        read_frame(tmp_path / "none.sqlite.gz", "--db")


def test_errors_of_a_gzipped_store_name_the_users_file(tmp_path):
    import gzip
    import sqlite3

    from moetune.tuner.store import read_frame

    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    packed = tmp_path / "theirs.sqlite.gz"
    packed.write_bytes(gzip.compress(foreign.read_bytes()))
    with pytest.raises(ValueError) as err:
        read_frame(packed, "--db")
    assert str(packed) in str(err.value) and "not a moetune results database" in str(err.value)


def test_a_store_from_before_the_launch_column_reads_and_gains_it(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with Store(path) as s:
        s.add({"kernel": "k", "device_name": "d", "shape": {"E": 1}, "config": {"a": 1}, "status": "ok"})
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE measurements DROP COLUMN launch")
    conn.commit()
    conn.close()
    with Store(path, readonly=True) as s:
        frame = s.frame()
        assert "launch" in frame.columns and frame["launch"].isna().all()
    with Store(path) as s:  # writable: the column is added, old rows keep it empty
        s.add({"kernel": "k", "device_name": "d", "shape": {"E": 1}, "config": {"a": 2}, "status": "ok",
               "launch": "pdl"})
        launch = s.frame()["launch"]
        assert launch.isna().tolist() == [True, False] and launch.iloc[1] == "pdl"
