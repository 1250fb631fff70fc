"""``moetune bench``: default, heuristic and table pick measured side by side on the interpreter."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables import format as tables
from moetune.tables import picker
from moetune.tuner.bench import COLUMNS, INTERPRETER_NOTE, KERNEL_ONLY_NOTE, Measured, bench


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def no_tables(tmp_path, monkeypatch):
    """The picker sees only an empty directory (until a test writes a table into it)."""
    root = tmp_path / "tables"
    root.mkdir()
    monkeypatch.setenv(picker.ENV_VAR, str(root))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    yield root
    picker.clear_cache()


def test_cli_writes_table_markdown_and_csv(cli, tmp_path, no_tables):
    md, csv = tmp_path / "bench.md", tmp_path / "bench.csv"
    res = cli("bench", "--model", "deepseek-v3", "--tp", "8", "--kernel", "gather_rows", "--tokens", "1,4",
              "--markdown", md, "--csv", csv)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "'tiny' model" in out and "times are meaningless" in out  # interpreter: tiny shapes, said so
    assert "gather_rows" in out and f"wrote {md}" in out and f"wrote {csv}" in out

    df = pd.read_csv(csv)
    assert list(df.columns) == list(COLUMNS)
    assert list(df["tokens"]) == [1, 4] and list(df["routes"]) == [2, 8]
    assert (df[[f"{r}_status" for r in ("default", "heuristic", "tuned")]] == "ok").all().all()
    assert (df["tuned_source"] == "heuristic").all()  # no table for the interpreter
    assert df["device"].eq("cpu-interpreter").all() and df["arch"].eq("interpreter").all()
    spec = get_spec("gather_rows")
    for _, row in df.iterrows():
        shape = json.loads(row["shape"])
        assert row["default_config"] == canonical_json(spec.default)
        heuristic = spec.heuristic(shape, row["routes"], "interpreter")
        assert row["heuristic_config"] == canonical_json({**spec.default, **heuristic})
        assert row["tuned_config"] == row["heuristic_config"]
        assert row["tuned_ms"] == row["heuristic_ms"]  # one measurement shown for both roles
        assert math.isclose(row["heuristic_speedup"], row["default_ms"] / row["heuristic_ms"])
        assert row["default_error"] == 0  # gather is bit-exact
    text = md.read_text()
    assert INTERPRETER_NOTE in text and "Device: cpu-interpreter" in text
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for col in ("kernel", "shape", "density", "default ms", "heuristic ms", "heuristic x", "tuned ms",
                "tuned x", "tuned roofline", "accuracy", "tuned source"):
        assert col in header
    assert len(lines) == 2 + 2 and "E8_N256_K256_topk2" in lines[2]


def test_kernel_only_bench_says_so_and_reaches_the_workers(cli, tmp_path, no_tables, monkeypatch):
    """--kernel-only times each op with its alignment and split made beforehand; the output and the
    Markdown say so, and the flag travels to the workers in the runner's timing options."""
    from moetune.tuner.backends.process import Runner

    seen = []
    real = Runner.__init__
    monkeypatch.setattr(Runner, "__init__", lambda self, *a, **kw: seen.append(kw.get("timing")) or real(
        self, *a, **kw))
    md = tmp_path / "k.md"
    res = cli("bench", "--model", "tiny", "--kernel", "fp8_decode.down", "--tokens", "2", "--kernel-only",
              "--markdown", md)
    assert res.exit_code == 0, res.output
    assert seen == [{"kernel_only": True}]
    assert "Kernel only" in " ".join(res.output.split()) and KERNEL_ONLY_NOTE in md.read_text()


def _gather_table(root, shape, config, density):
    spec = get_spec("gather_rows")
    doc = {"format": tables.FORMAT, "version": tables.VERSION, "kernel": "gather_rows", "arch": "interpreter",
           "device": None, "device_names": ["cpu-interpreter"], "shape": shape, "default": dict(spec.default),
           "strategy": ["exhaustive"], "candidates": {"measured": 3, "ok": 3, "rejected": {}},
           "versions": {"moetune": "0.1.0", "triton": "3.6.0", "torch": "2.11", "cuda": "12.8"},
           "date": "2026-11-29",
           "entries": [{"density": density, "config": config, "time_ms": 1.0, "default_ms": 2.0,
                        "speedup": 2.0, "spread": 0.01, "error": 0.0, "roofline_frac": None}]}
    path = tables.table_path(root, "interpreter", "gather_rows", shape)
    tables.write(path, doc)
    return path


def test_api_uses_the_table_and_repeats(no_tables):
    spec = get_spec("gather_rows")
    shape = spec.normalize_shape(spec.shape_from_model(get_model("tiny")))
    heuristic = {**spec.default, **spec.heuristic(shape, 2, "interpreter")}
    mine = {"BLOCK_SIZE_K": 128, "ROWS_PER_PROGRAM": 1, "num_warps": 1}
    assert mine not in (heuristic, spec.default)
    path = _gather_table(no_tables, shape, mine, 0.25)
    seen = []
    result = bench(["gather_rows"], model="tiny", tokens=[1], repeat=2, on_row=seen.append)
    assert not result.meaningful and result.device.arch == "interpreter"
    (row,) = result.rows
    assert seen == [row]
    assert row["tuned_config"] == canonical_json(mine)
    assert row["tuned_source"].endswith(f"{path.name} @ density 0.25")
    assert {row[f"{r}_status"] for r in ("default", "heuristic", "tuned")} == {"ok"}
    for role in ("default", "heuristic", "tuned"):  # two rounds: the spread is across them
        assert row[f"{role}_ms"] > 0 and row[f"{role}_spread"] >= 0
    assert row["tuned_speedup"] == pytest.approx(row["default_ms"] / row["tuned_ms"])
    assert list(result.frame().columns) == list(COLUMNS)


def test_fp8_decode_accuracy_checked(no_tables):
    result = bench(["fp8_decode.down"], model="tiny", tokens=[1])
    (row,) = result.rows
    spec = get_spec("fp8_decode.down")
    for role in ("default", "heuristic", "tuned"):
        assert row[f"{role}_status"] == "ok", row[f"{role}_reason"]
        assert 0 <= row[f"{role}_error"] <= spec.tolerance
    assert row["tuned_roofline"] is None and row["tuned_source"] == "heuristic"  # interpreter: no ceilings


def test_measured_from_rounds():
    ok = {"status": "ok", "time_ms": 2.0, "spread": 0.1, "error": 0.001, "roofline_frac": 0.5}
    m = Measured.from_rounds([ok, {**ok, "time_ms": 4.0, "roofline_frac": 0.25}, {**ok, "time_ms": 3.0}])
    assert (m.status, m.time_ms, m.roofline) == ("ok", 3.0, 0.5)
    assert m.spread == pytest.approx((4.0 - 2.0) / 3.0)
    assert Measured.from_rounds([ok]).spread == 0.1  # one round: the timing's own spread
    bad = Measured.from_rounds([ok, {"status": "inaccurate", "reason": "error 0.5", "error": 0.5}])
    assert (bad.status, bad.reason, bad.time_ms) == ("inaccurate", "error 0.5", None)


@pytest.mark.parametrize("args, message", [
    (["--kernel", "nope", "--model", "tiny"], "unknown kernel 'nope'"),
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--model", "tiny", "--repeat", "0"], "--repeat must be >= 1"),
    (["--model", "tiny", "--tokens", "1", "--routes", "8"], "not both"),
    (["--kernel", "gather_rows", "--shape", "E=8,K=256,top_k=2", "--tp", "2"], "--tp/--ep need --model"),
    (["--model", "tiny", "--tokens", "x"], "cannot parse list"),
    (["--model", "tiny", "--csv", "/nonexistent-dir/b.csv"], "does not exist"),
    (["--model", "tiny", "--markdown", "."], "is a directory"),
])
def test_bad_input_one_line(cli, args, message):
    res = cli("bench", *args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    assert res.output.count("error:") == 1
