"""Hostile table files: the picker never raises on a file's content and spends bounded time on one;
verify reports each as an error, without a traceback."""

from __future__ import annotations

import json

import pytest
from test_tables_toy import DEVICE, KERNEL, SHAPE, SPEC, cfg, entry, put, table, toy_registered  # noqa: F401

from moetune.tables import format as tables
from moetune.tables import picker
from moetune.tuner.verify import verify


@pytest.fixture
def env(tmp_path, monkeypatch):
    root = tmp_path / "env"
    root.mkdir()
    monkeypatch.setenv(picker.ENV_VAR, str(root))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    yield root
    picker.clear_cache()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _big_table() -> str:
    """A well-formed table far over the size cap (many valid entries)."""
    doc = table([entry(1.0 + i / 8, cfg(16)) for i in range(20000)], device=None)
    return tables.dumps(doc)


HOSTILE_TEXT = {
    "nested array": lambda: _nested(200_000),
    "nested in a field": lambda: json.dumps(table([entry(2.0, cfg(16))], device=None))[:-1]
    + ', "x": ' + _nested(100_000) + "}",
    "nested objects": lambda: '{"a":' * 100_000 + "1" + "}" * 100_000,
    "oversized": _big_table,
    "binary": lambda: "\x00\xff" * 100,  # not UTF-8 once written as latin-1 bytes
}


HOSTILE = {name: (lambda make=make, enc="latin-1" if name == "binary" else "utf-8": make().encode(enc))
           for name, make in HOSTILE_TEXT.items()}


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_the_picker_never_raises_on_a_hostile_table(env, how):
    path = put(env, table([entry(2.0, cfg(16))], device=None))
    path.write_bytes(HOSTILE[how]())
    with pytest.warns(picker.TableWarning, match="ignoring table"):
        p = picker.pick_config_with_source(KERNEL, SHAPE, 16, device=DEVICE, arch="sm_90")
    assert p.source == "heuristic" and dict(p.config) == SPEC.default


def test_oversized_tables_are_refused_before_parsing(env):
    path = put(env, table([entry(2.0, cfg(16))], device=None))
    path.write_text(_big_table())
    assert path.stat().st_size > tables.MAX_TABLE_BYTES
    with pytest.raises(tables.TableError, match="at most"):
        tables.read(path)
    with pytest.raises(tables.TableError, match="at most"):
        tables.loads(path.read_text(), path)


def test_too_many_entries_is_a_table_error(tmp_path):
    doc = table([entry(1.0 + i / 8, cfg(16)) for i in range(tables.MAX_ENTRIES + 1)], device=None)
    text = tables.dumps(doc)
    assert len(text) < tables.MAX_TABLE_BYTES  # refused for its entries, not its size
    with pytest.raises(tables.TableError, match="entries"):
        tables.loads(text, tmp_path / "t.json")


@pytest.mark.parametrize("how", ["nested array", "oversized"])
def test_verify_reports_hostile_tables_as_errors(env, how):
    path = put(env, table([entry(2.0, cfg(16))], device=None))
    path.write_bytes(HOSTILE[how]())
    files, findings = verify([env], schema_only=True)
    errors = [f for f in findings if f.level == "error"]
    assert errors and all("Traceback" not in f.message for f in errors)
    assert any(str(path) in (f.path or "") or str(path) in f.message for f in errors)
