"""The export, show, pick and verify commands through typer's test runner."""

from __future__ import annotations

import json

import pytest
from test_tables_toy import DEVICE, KERNEL, SHAPE, SPEC, cfg, entry, put, row, table, toy_registered  # noqa: F401
from typer.testing import CliRunner

from moetune.cli import _common, app
from moetune.cli import tables as tables_cli
from moetune.tables import format as tables
from moetune.tables import picker
from moetune.tuner.store import Store

SHAPE_ARG = "E=8,N=64,K=128,top_k=2"


@pytest.fixture
def cli(monkeypatch, tmp_path):
    for c in (_common.console, _common.err_console):
        monkeypatch.setattr(c, "width", 250)  # no wrapping inside the asserted lines
    monkeypatch.setenv(picker.ENV_VAR, str(tmp_path / "configs"))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    runner = CliRunner()
    yield lambda *args: runner.invoke(app, [str(a) for a in args])
    picker.clear_cache()


def test_export_show_pick_verify(cli, tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    with Store(db) as s:
        for tokens, best in ((1, cfg(16)), (16, cfg(64, 128, 8))):
            s.add(row(SPEC.default, 2.0, tokens=tokens))
            s.add(row(best, 1.0, tokens=tokens))
    res = cli("export", "--db", db, "--out", out)
    assert res.exit_code == 0, res.output
    assert "2 added" in res.output and "nvidia_toy_9000" in res.output

    res = cli("show", out / "sm_90" / KERNEL / "E8_N64_K128_topk2_bfloat16.json")
    assert res.exit_code == 0, res.output
    assert "BM16 BK128 w4" in res.output and "2.00x" in res.output and "0.25" in res.output

    res = cli("show", "--kernel", KERNEL, "--arch", "sm_90")
    assert res.exit_code == 0
    assert f"bfloat16 on {DEVICE}" in res.output and "bfloat16 on arch sm_90" in res.output

    res = cli("pick", "--kernel", KERNEL, "--shape", SHAPE_ARG, "--routes", 2, "--device", DEVICE, "--json")
    assert res.exit_code == 0, res.output
    answer = json.loads(res.output)
    assert (answer["config"], answer["source"], answer["table_density"]) == (cfg(16), "device", 0.25)

    res = cli("pick", "--kernel", KERNEL, "--shape", SHAPE_ARG, "--routes", 64, "--arch", "sm_90")
    assert res.exit_code == 0 and "source: arch" in res.output and '"BLOCK_SIZE_M": 64' in res.output

    res = cli("verify", out, "--schema-only")
    assert res.exit_code == 0 and "2 table file(s) checked, 2 ok" in res.output


def test_export_reports_bad_rows_and_exits_non_zero(cli, tmp_path):
    db = tmp_path / "r.sqlite"
    with Store(db) as s:
        s.add(row(SPEC.default, 2.0))
        bad = s.add(row(cfg(16), 1.0, device="x/../../y"))
    res = cli("export", "--db", db, "--out", tmp_path / "configs")
    assert res.exit_code == 1
    assert f"row {bad}: field device_name" in res.output


def test_export_bad_arguments_are_one_line_errors(cli, tmp_path):
    res = cli("export", "--db", tmp_path / "none.sqlite")
    assert res.exit_code == 2 and "no results database" in res.output
    (tmp_path / "junk.sqlite").write_text("not a database")
    res = cli("export", "--db", tmp_path / "junk.sqlite", "--kernel", KERNEL)
    assert res.exit_code == 2 and "not a moetune results database" in res.output


def test_pick_without_tables_says_heuristic(cli):
    res = cli("pick", "--kernel", KERNEL, "--shape", SHAPE_ARG, "--routes", 16, "--arch", "sm_89")
    assert res.exit_code == 0, res.output
    assert "source: heuristic" in res.output
    assert json.dumps(SPEC.heuristic(SHAPE, 16, "sm_89"), sort_keys=True) in res.output


def test_pick_from_a_model_preset(cli):
    res = cli("pick", "--kernel", "gather_rows", "--model", "tiny", "--routes", 4, "--json")
    assert res.exit_code == 0, res.output
    answer = json.loads(res.output)
    assert answer["shape"]["E"] == 8 and answer["source"] == "heuristic"


@pytest.mark.parametrize("args, message", [
    (["--kernel", "nope.kernel", "--shape", SHAPE_ARG, "--routes", "4"], "unknown kernel"),
    (["--kernel", KERNEL, "--routes", "4"], "exactly one of --model or --shape"),
    (["--kernel", KERNEL, "--shape", "E=8,N=64", "--routes", "4"], "needs 'K'"),
    (["--kernel", KERNEL, "--shape", SHAPE_ARG, "--routes", "-3"], "--routes"),
    (["--kernel", "gather_rows", "--model", "nope", "--routes", "4"], "unknown model"),
])
def test_pick_bad_input(cli, args, message):
    res = cli("pick", *args)
    assert res.exit_code == 2 and message in res.output


def test_verify_names_file_and_field_and_fails(cli, tmp_path):
    root = tmp_path / "configs"
    put(root, table([entry(0.5, cfg(16))]))
    bad = put(root, table([entry(0.5, cfg(16))], device=None))
    bad.write_text(bad.read_text().replace('"time_ms": 1.0', '"time_ms": -1.0'))
    res = cli("verify", root, "--schema-only")
    assert res.exit_code == 1
    assert f"{bad}: entries[0].time_ms" in res.output and "1 ok, 1 error(s)" in res.output


def test_verify_an_empty_tree_or_a_missing_path_fails(cli, tmp_path):
    """A path with nothing to check is a typo, not a pass: one line, non-zero, also beside a good one."""
    root = tmp_path / "configs"
    put(root, table([entry(0.5, cfg(16))]))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("no tables")
    for args in ([tmp_path / "empty"], [root, tmp_path / "empty"]):
        res = cli("verify", *args, "--schema-only")
        assert res.exit_code == 2 and "no table files (*.json) under" in res.output, res.output
        assert res.output.strip().startswith("error:") and len(res.output.strip().splitlines()) == 1
    res = cli("verify", tmp_path / "missing")
    assert res.exit_code == 2 and "no table file or directory" in res.output
    assert "Traceback" not in res.output


def test_show_needs_something_to_show(cli, tmp_path):
    assert cli("show").exit_code == 2
    res = cli("show", "--kernel", KERNEL)
    assert res.exit_code == 2 and "no tables found" in res.output


def _rows(output: str) -> list[str]:
    """The lines of the entries' table that hold a data row (rich splits a row's cells by "│", the
    header's by "┃")."""
    return [line for line in output.splitlines() if "│" in line]


def _widest_packaged_table():
    """The packaged table whose configs print longest (the hardest to fit)."""
    return max(sorted(picker.PACKAGED.rglob("*.json")),
               key=lambda f: max(len(_common.fmt_config(e["config"])) for e in tables.read(f)["entries"]))


def test_show_fits_100_columns_one_line_a_row(cli, monkeypatch):
    path = _widest_packaged_table()
    doc = tables.read(path)
    for c in (_common.console, _common.err_console):
        monkeypatch.setattr(c, "width", 100)
    res = cli("show", path)
    assert res.exit_code == 0, res.output
    rows = _rows(res.output)
    assert len(rows) == len(doc["entries"]), res.output  # one line per entry
    assert all(len(line) <= 100 for line in res.output.splitlines())
    for e, line in zip(doc["entries"], rows, strict=True):  # the numbers are never the ones cut
        assert f"{e['time_ms']:.4g}" in line and f"{e['speedup']:.2f}x" in line, line
    header = [line for line in res.output.splitlines() if "┃" in line]
    assert len(header) == 1 and "default ms" not in header[0] and "roofline" not in header[0]

    res = cli("show", path, "--wide")
    assert res.exit_code == 0 and "default ms" in res.output and "roofline" in res.output


def test_show_takes_families_repeated_kernels_and_names_unknown_ones(cli, tmp_path):
    put(tmp_path / "configs", table([entry(0.5, cfg(16))]))
    res = cli("show", "-k", KERNEL, "-k", "fp8_decode.gate_up")  # the second has no tables here
    assert res.exit_code == 0, res.output
    assert f"{KERNEL} E8_N64_K128_topk2_bfloat16 on {DEVICE}" in res.output
    res = cli("show", "--kernel", "toy")  # a family: every toy.* op
    assert res.exit_code == 0 and f"{KERNEL} E8_N64_K128" in res.output, res.output
    res = cli("show", "--kernel", "fp9_decode.gate_up")
    assert res.exit_code == 2 and "unknown kernel 'fp9_decode.gate_up'" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("arch", ["h100", "sm90", "SM_90", "sm_999"])
def test_pick_names_an_unknown_arch(cli, arch):
    res = cli("pick", "-k", KERNEL, "--shape", SHAPE_ARG, "--routes", 16, "--arch", arch)
    assert res.exit_code == 2 and f"unknown arch {arch!r}" in res.output and "sm_90" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_pick_takes_the_short_flags(cli):
    res = cli("pick", "-k", "gather_rows", "-m", "tiny", "--routes", 4, "--json")
    assert res.exit_code == 0 and json.loads(res.output)["source"] == "heuristic", res.output


def _interpreter_store(db):
    with Store(db) as s:
        for time_ms, config in ((2.0, SPEC.default), (1.0, cfg(16))):
            s.add(row(config, time_ms, device="cpu-interpreter", arch="interpreter"))
    return db


def test_export_of_interpreter_results_keeps_out_of_the_packaged_tables(cli, tmp_path, monkeypatch):
    packaged = tmp_path / "packaged"
    monkeypatch.setattr(tables_cli, "PACKAGED", packaged)
    db = _interpreter_store(tmp_path / "cpu.sqlite")
    res = cli("export", "--db", db)
    assert res.exit_code == 2 and "interpreter" in res.output and "--allow-interpreter" in res.output
    assert res.output.strip().startswith("error:") and "Traceback" not in res.output
    assert not packaged.exists()

    res = cli("export", "--db", db, "--out", tmp_path / "mine")  # a separate tree: written
    assert res.exit_code == 0 and list((tmp_path / "mine").rglob("*.json")), res.output
    res = cli("export", "--db", db, "-k", KERNEL, "--allow-interpreter")  # asked for
    assert res.exit_code == 0 and list(packaged.rglob("*.json")), res.output


def test_export_of_gpu_results_writes_the_packaged_tables(cli, tmp_path, monkeypatch):
    packaged = tmp_path / "packaged"
    monkeypatch.setattr(tables_cli, "PACKAGED", packaged)
    db = tmp_path / "gpu.sqlite"
    with Store(db) as s:
        s.add(row(SPEC.default, 2.0))
        s.add(row(cfg(16), 1.0))
    res = cli("export", "--db", db)
    assert res.exit_code == 0 and list(packaged.rglob("*.json")), res.output
