"""``moetune plot``: PNGs from a store and from a bench CSV, the numbers behind them, bad input."""

from __future__ import annotations

import gzip
import sys

import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.device import INTERPRETER
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tuner import plots
from moetune.tuner.bench import COLUMNS, BenchResult
from moetune.tuner.store import Store

KERNEL = "fp8_decode.gate_up"
SPEC = get_spec(KERNEL)
SHAPE = SPEC.normalize_shape(SPEC.shape_from_model(get_model("tiny")))
DEVICE = "NVIDIA H200"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _row(tokens, config, time_ms, status="ok", device=DEVICE, routing="uniform"):
    routes = tokens * SHAPE["top_k"]
    return {"sweep_id": "t", "kernel": KERNEL, "device_name": device, "arch": "sm_90", "shape": SHAPE,
            "tokens": tokens, "routes": routes, "active_fraction": 1.0, "routing": routing,
            "density": routes / SHAPE["E"], "config": {**SPEC.default, **config}, "status": status,
            "error": 0.002 if status == "ok" else 0.4, "time_ms": time_ms if status == "ok" else None,
            "spread": 0.01, "n_runs": 50, "roofline_frac": 0.3, "strategy": "model"}


def _bm_time(tokens, bm):
    """A plausible landscape: small tiles win at few rows, larger ones as rows per expert grow."""
    rows = tokens * SHAPE["top_k"] / SHAPE["E"]
    return 0.01 * (1 + rows / bm) * (1 + bm / 256)


TOKENS = (1, 2, 4, 8, 16)


@pytest.fixture
def store(tmp_path):
    """What a sweep of the tiny model's gate/up GEMM on an H200 leaves: the default at every point,
    BLOCK_SIZE_M variants, the heuristic at two points, one fast but inaccurate config, and a few
    rows of another device and routing that must not leak in."""
    path = tmp_path / "r.sqlite"
    with Store(path) as s:
        for t in TOKENS:
            s.add(_row(t, {}, 0.05 * (1 + t / 8)))
            for bm in (16, 32, 64):
                s.add(_row(t, {"ALGO": "grouped", "BLOCK_SIZE_M": bm}, _bm_time(t, bm)))
            s.add(_row(t, {"ALGO": "grouped", "BLOCK_SIZE_M": 16, "num_warps": 2}, 1e-4, status="inaccurate"))
        for t in (1, 16):
            s.add(_row(t, SPEC.heuristic(SHAPE, t * SHAPE["top_k"], "sm_90"), 0.03 * (1 + t / 16)))
        s.add(_row(1, {}, 5.0, device="NVIDIA A100"))
        s.add(_row(1, {}, 5.0, routing="zipf:1.2"))
    return path


def _is_png(path):
    data = path.read_bytes()
    return data[:8] == PNG and len(data) > 1000


def test_series_and_heat_numbers(store):
    rows = plots.store_rows(store, KERNEL)
    assert set(rows["device_name"]) == {DEVICE} and set(rows["routing"]) == {"uniform"}
    (series,) = plots.series_from_store(rows, KERNEL)
    f = series.frame.set_index("density")
    assert list(f.index) == sorted(t * SHAPE["top_k"] / SHAPE["E"] for t in TOKENS)
    for t in TOKENS:
        d = t * SHAPE["top_k"] / SHAPE["E"]
        assert f.loc[d, "default_ms"] == pytest.approx(0.05 * (1 + t / 8))
        # the best accurate time: the inaccurate 1e-4 ms row never counts
        assert f.loc[d, "tuned_ms"] == pytest.approx(min(_bm_time(t, bm) for bm in (16, 32, 64)))
    assert f.loc[0.25, "heuristic_ms"] == pytest.approx(0.03 * (1 + 1 / 16))
    assert f["heuristic_ms"].notna().sum() == 2  # only where a sweep measured it

    packed = store.with_name(store.name + ".gz")  # as stores are committed
    packed.write_bytes(gzip.compress(store.read_bytes()))
    assert plots.store_rows(packed, KERNEL).reset_index(drop=True).equals(rows.reset_index(drop=True))

    assert plots.tile_param(rows, KERNEL) == "BLOCK_SIZE_M"
    heat = plots.heat_frame(rows, "BLOCK_SIZE_M")
    assert list(heat.index) == [16, 32, 64] and len(heat.columns) == len(TOKENS)
    assert heat.loc[64, 4.0] == pytest.approx(_bm_time(16, 64))


def test_cli_writes_pngs_from_store(cli, store, tmp_path):
    pytest.importorskip("matplotlib", reason="moetune plot needs the plot extra (matplotlib)")
    out = tmp_path / "plots"
    res = cli("plot", "--db", store, "--kernel", KERNEL, "--model", "tiny", "--out", out)
    assert res.exit_code == 0, res.output
    paths = sorted(out.iterdir())
    assert [p.name.rsplit("_", 1)[1] for p in paths] == ["heatmap.png", "time.png"]
    assert all(_is_png(p) for p in paths)
    assert all(p.name in res.output.replace("\n", "") for p in paths)
    assert all("nvidia_h200" in p.name and "e8_n256_k256_topk2" in p.name for p in paths)
    # the other routing has its own plots (and no heat-map cells beyond its one accurate row)
    res = cli("plot", "--db", store, "--kernel", KERNEL, "--routing", "zipf:1.2", "--out", out)
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*zipf_1_2*.png"))) == 2


def test_cli_writes_png_from_bench_csv(cli, tmp_path):
    pytest.importorskip("matplotlib", reason="moetune plot needs the plot extra (matplotlib)")
    rows = []
    for t in TOKENS:
        routes = t * SHAPE["top_k"]
        row = dict.fromkeys(COLUMNS)
        row.update(kernel=KERNEL, shape=canonical_json(SHAPE), tokens=t, routes=routes, active_fraction=1.0,
                   routing="uniform", density=routes / SHAPE["E"], tuned_source="heuristic")
        row.update(device="cpu-interpreter", arch="interpreter", default_ms=2.0 * t, heuristic_ms=1.5 * t,
                   tuned_ms=1.0 * t)
        rows.append(row)
    csv = BenchResult(rows=rows, device=INTERPRETER).write_csv(tmp_path / "bench.csv")
    (series,) = plots.series_from_bench(csv, KERNEL)
    assert series.arch == "interpreter" and list(series.frame["tuned_ms"]) == [1.0 * t for t in TOKENS]
    out = tmp_path / "plots"
    res = cli("plot", "--bench", csv, "--kernel", KERNEL, "--shape", "E=8,N=256,K=256,top_k=2", "--out", out)
    assert res.exit_code == 0, res.output
    (path,) = out.iterdir()
    assert path.name.endswith("_time.png") and _is_png(path)


def test_missing_matplotlib_is_one_line(cli, store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    res = cli("plot", "--db", store, "--kernel", KERNEL, "--out", tmp_path / "p")
    assert res.exit_code == 2 and "pip install 'moetune[plot]'" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "p").exists()


@pytest.mark.parametrize("args, message", [
    (["--kernel", KERNEL], "give --db"),
    (["--db", "DB", "--kernel", "gather_rows"], "no rows in"),
    (["--db", "DB", "--kernel", KERNEL, "--shape", "E=8,N=64,K=64,top_k=2"], "no fp8_decode.gate_up rows for "
                                                                              "shape E8_N64_K64_topk2"),
    (["--db", "DB", "--kernel", KERNEL, "--model", "tiny", "--shape", "E=8,N=64,K=64,top_k=2"], "not both"),
    (["--db", "DB", "--kernel", KERNEL, "--tp", "2"], "--tp/--ep need --model"),
    (["--db", "DB", "--kernel", KERNEL, "--device", "NVIDIA B200"], "--device 'NVIDIA B200': no rows"),
    (["--db", "DB", "--kernel", KERNEL, "--routing", "zipf:3"], "--routing 'zipf:3'"),
    (["--db", "MISSING", "--kernel", KERNEL], "no results database"),
    (["--bench", "MISSING", "--kernel", KERNEL], "no such file"),
    (["--bench", "NOTBENCH", "--kernel", KERNEL], "not a moetune bench CSV"),
    (["--db", "DB", "--kernel", KERNEL, "--model", "gpt-9"], "unknown model 'gpt-9'"),
])
def test_bad_input_one_line(cli, store, tmp_path, args, message):
    pytest.importorskip("matplotlib", reason="moetune plot needs the plot extra (matplotlib)")
    (tmp_path / "notbench.csv").write_text("a,b\n1,2\n")
    subs = {"DB": store, "MISSING": tmp_path / "missing.sqlite", "NOTBENCH": tmp_path / "notbench.csv"}
    out = tmp_path / "out"
    res = cli("plot", *[subs.get(a, a) for a in args], "--out", out)
    assert res.exit_code == 2, res.output
    assert message in res.output.replace("\n", " ") and "Traceback" not in res.output
    assert not out.exists()  # nothing written on bad input


def test_out_must_be_a_directory(cli, store, tmp_path):
    pytest.importorskip("matplotlib", reason="moetune plot needs the plot extra (matplotlib)")
    target = tmp_path / "file.png"
    target.write_bytes(b"x")
    res = cli("plot", "--db", store, "--kernel", KERNEL, "--out", target)
    assert res.exit_code == 2 and "is a file" in res.output
