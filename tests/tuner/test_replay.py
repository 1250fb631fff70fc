"""moetune replay: loading stored sweeps, the lookup's noise, budgets, the CLI."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.tuner.replay import Lookup, budget_for, load_points, parse_budgets, replay, replay_point, summary
from moetune.tuner.store import Store

DATA = "tests/data/toy_landscape.csv.gz"


def test_sqlite_and_csv_give_the_same_points(tmp_path):
    df = pd.read_csv(DATA)
    db = tmp_path / "ref.sqlite"
    with Store(db) as store:
        for row in df.head(300).to_dict("records"):
            store.add({k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()})
    a = load_points(db)
    df.head(300).to_csv(tmp_path / "ref.csv", index=False)
    b = load_points(tmp_path / "ref.csv")
    assert [p.label for p in a] == [p.label for p in b]
    assert a[0].configs == b[0].configs and np.allclose(a[0].time_ms, b[0].time_ms, equal_nan=True)


def test_repeated_rows_pool_into_one_candidate(tmp_path):
    df = pd.read_csv(DATA)
    point = df[df["tokens"] == 1]
    ok = point[point["status"] == "ok"]
    again = ok.head(5).assign(time_ms=lambda d: d["time_ms"] * 3, strategy="remeasure")
    pd.concat([point, again]).to_csv(tmp_path / "r.csv", index=False)
    (p,) = load_points(tmp_path / "r.csv")
    assert len(p.configs) == len(point)
    i = p.index[again["config"].iloc[0]]
    assert p.time_ms[i] == pytest.approx(2 * again["time_ms"].iloc[0] / 3)  # median of (t, 3t)


def test_lookup_draws_recorded_noise():
    (p, _) = load_points(DATA)
    i = int(np.nanargmin(p.time_ms))
    look = Lookup(p, seed=0, noise=1.0)
    times = np.array([look.measure(p.configs[i]).time_ms for _ in range(400)])
    assert look.count == 400
    assert np.median(times) == pytest.approx(p.time_ms[i], rel=0.01)
    rel_spread = (np.quantile(times, 0.8) - np.quantile(times, 0.2)) / np.median(times)
    assert rel_spread == pytest.approx(p.spread[i], rel=0.25)
    assert Lookup(p, seed=0, noise=0.0).measure(p.configs[i]).time_ms == p.time_ms[i]
    bad = p.status.index("compile_error")
    assert Lookup(p, 0, 1.0).measure(p.configs[bad]).status == "compile_error"


def test_budgets():
    assert parse_budgets("5%, 10%,64") == ["5%", "10%", "64"]
    for text in ("", "x", "-3", "0%"):
        with pytest.raises(ValueError, match="--budget"):
            parse_budgets(text)
    (p, _) = load_points(DATA)
    assert budget_for("10%", p) == int(np.ceil(0.1 * len(p.configs)))
    assert budget_for("12", p) == 12


def test_exhaustive_finds_the_best_and_hints_flow(tmp_path):
    points = load_points(DATA)
    r = replay_point(points[0], "exhaustive", len(points[0].configs), seed=0, batch=64, noise=0.0)
    assert r["quality"] == 1.0 and r["measurements"] == len(points[0].configs)
    assert r["rounds"] == -(-len(points[0].configs) // 64)  # batches of 64 (this toy point has no default)
    one = replay_point(points[0], "model", 20, seed=0, batch=1, noise=0.0)
    assert one["rounds"] == one["measurements"] == 20  # one batch a measurement (no finals at this budget)
    runs = replay(points, ["coordinate"], ["10%"], seeds=2)
    assert len(runs) == 4 and set(runs["point"]) == {p.label for p in points}
    s = summary(runs)
    assert s["share"].iloc[0] <= 0.101 and s["quality"].iloc[0] >= 1.0


def test_cli_replay_tables_and_files(tmp_path):
    out_csv, out_md = tmp_path / "runs.csv", tmp_path / "r.md"
    res = CliRunner().invoke(app, ["replay", "--data", DATA, "--strategy", "model,random",
                                   "--budget", "10%,40", "--seeds", "2", "--batch", "4",
                                   "--csv", str(out_csv), "--markdown", str(out_md)])
    assert res.exit_code == 0, res.output
    assert "replay: 2 point(s), 2 seed(s), batch 4" in res.output
    runs = pd.read_csv(out_csv)
    assert len(runs) == 2 * 2 * 2 * 2 and set(runs["strategy"]) == {"model", "random"}
    assert (runs.loc[runs["budget"].astype(str) == "40", "measurements"] <= 40).all()
    md = out_md.read_text()
    assert md.startswith("`moetune ") and "| strategy | budget |" in md and "Per point" in md


@pytest.mark.parametrize("args, message", [
    (["--strategy", "nope"], "unknown strategy"),
    (["--budget", "ten"], "--budget"),
    (["--kernel", "fp8_decode"], "--kernel"),
    (["--seeds", "0"], "--seeds"),
    (["--data", "missing.csv"], "no such file"),
])
def test_cli_bad_input(args, message):
    base = ["replay", "--data", DATA, "--seeds", "1"]
    res = CliRunner().invoke(app, base + args)
    assert res.exit_code != 0
    assert message in res.output and "Traceback" not in res.output


def test_cli_foreign_file(tmp_path):
    bad = tmp_path / "x.sqlite"
    bad.write_text("not sqlite")
    res = CliRunner().invoke(app, ["replay", "--data", str(bad)])
    assert res.exit_code != 0 and "not a moetune results database" in res.output
    assert "Traceback" not in res.output


def test_rows_from_before_a_spec_change_meet_todays_candidates():
    import json

    from moetune.problem import canonical_json
    from moetune.specs.registry import get_spec
    from moetune.tuner.store import read_frame

    data = "data/reference/reference.csv.gz"
    spec = get_spec("fp8_decode.down")
    raw = read_frame(data)
    raw = raw[(raw["kernel"] == spec.name) & (raw["tokens"] == 1) & raw["shape"].str.contains('"E":256')]
    old = [c for c in raw["config"] if set(spec.default) - set(json.loads(c))]
    assert old  # the oldest rows here predate keys the spec has now (A_FP8, FUSE, PREFETCH)
    points = load_points(data, kernels=["fp8_decode.down"], min_candidates=20)
    p = next(p for p in points if p.tokens == 1 and p.shape["E"] == 256)
    assert all(set(c) == set(spec.default) for c in p.configs)
    assert len(p.configs) < raw["config"].nunique()  # old and new rows of one config are one candidate
    assert p.default == spec.default
    r = replay_point(p, "coordinate", 1, seed=0)  # a budget of one: the default, measured first
    assert r["measurements"] == 1 and r["winner"] == canonical_json(p.default)


def test_replay_hands_one_ops_winner_to_the_other_op_of_its_path():
    from moetune.problem import canonical_json
    from moetune.tuner.replay import _siblings

    points = load_points("data/reference/reference.csv.gz", kernels=["fp4_prefill"])
    down = next(p for p in points if p.kernel == "fp4_prefill.down" and p.routes == 1536)
    gate_up = next(p for p in points if p.kernel == "fp4_prefill.gate_up" and p.routes == 1536)
    won = down.configs[int(np.nanargmin(down.time_ms))]
    got = _siblings(gate_up, [("fp4_prefill.down", won)])
    assert len(got) == 1 and canonical_json(got[0]) in gate_up.index
    assert {k: v for k, v in got[0].items() if k in won} == won  # gate_up's extra key (A_LAYOUT) added
    assert _siblings(gate_up, [("fp4_prefill.gate_up", won)]) == []  # its own op is not a sibling


def test_the_heuristic_hint_can_be_left_out(monkeypatch):
    from moetune.specs.registry import get_spec

    points = load_points("data/reference/reference.csv.gz", kernels=["fp4_prefill.gate_up"])
    p = next(p for p in points if p.routes == 24576)
    # a heuristic that names this point's measured best (the sm_90 one now picks lut tiles, which the
    # reference slice does not hold): measured second (after the default), or not at all
    best = p.configs[int(np.nanargmin(p.time_ms))]
    monkeypatch.setattr(type(get_spec(p.kernel)), "heuristic", lambda self, shape, routes, arch: dict(best))
    with_h = replay([p], ["coordinate"], ["3"], seeds=1)
    without = replay([p], ["coordinate"], ["3"], seeds=1, heuristic=False)
    assert with_h["quality"].iloc[0] == 1.0 and without["quality"].iloc[0] > 1.0


def test_cli_honest_replay_flags(tmp_path):
    """--holdout, --train, --noise-model repeat with --noise-data, --no-warm-starts through the runner."""
    import json

    rng = np.random.default_rng(0)
    noisy = pd.DataFrame([{"kernel": "toy.gemm", "device_name": "Synthetic GPU", "shape": "{}", "tokens": 1,
                           "routes": 8, "active_fraction": 1.0, "routing": "uniform", "status": "ok",
                           "config": json.dumps({"i": i}), "sweep_id": s,
                           "time_ms": (1 + i / 100) * np.exp(0.01 * rng.standard_normal())}
                          for s in (1, 2) for i in range(200)])
    noisy.to_csv(tmp_path / "noise.csv", index=False)
    out_md = tmp_path / "r.md"
    res = CliRunner().invoke(app, ["replay", "--data", DATA, "--strategy", "prior,model", "--budget", "5%",
                                   "--seeds", "1", "--holdout", "--train", DATA, "--noise-model", "repeat",
                                   "--noise-data", str(tmp_path / "noise.csv"), "--no-warm-starts",
                                   "--markdown", str(out_md)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "leave-one-model-out, heuristic off, warm starts off" in flat
    assert "noise: repeated sweeps x 1" in flat and "per model grid" in flat
    assert "Per model grid" in out_md.read_text()
    res = CliRunner().invoke(app, ["replay", "--data", DATA, "--seeds", "1", "--noise-model", "wide"])
    assert res.exit_code != 0 and "--noise-model" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["replay", "--data", DATA, "--seeds", "1", "--noise-model", "repeat",
                                   "--noise-data", DATA])  # the toy data has no repeated sweeps
    assert res.exit_code != 0 and "--noise-data: lacks column(s) ['sweep_id']" in res.output
