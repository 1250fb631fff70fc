"""moetune export: choosing per density from the store, noise rules, device/arch files, merging, bad rows."""

from __future__ import annotations

import math

import pytest
from test_tables_toy import DEVICE, KERNEL, SHAPE, SPEC, cfg, row, toy_registered  # noqa: F401

from moetune.device import DeviceInfo
from moetune.tables import format as tables
from moetune.tables import picker
from moetune.tuner.export import export
from moetune.tuner.store import Store

DEFAULT = dict(SPEC.default)
H = DeviceInfo(name=DEVICE, arch="sm_90", sm_count=132, max_shared_mem=232448, l2_bytes=60 << 20, is_gpu=True)


def fill(path, rows):
    with Store(path) as s:
        return [s.add(r) for r in rows]


def read(out, device=DEVICE, arch="sm_90", shape=SHAPE):
    return tables.read(tables.table_path(out, arch, KERNEL, shape, device=device))


def by_density(doc):
    return {e["density"]: e for e in doc["entries"]}


def test_best_accurate_config_per_density_into_device_and_arch_tables(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    rows = []
    for tokens, best in ((1, cfg(16)), (4, cfg(32)), (16, cfg(64, 128, 8))):
        rows += [row(DEFAULT, 2.0, tokens=tokens), row(best, 1.0, tokens=tokens),
                 row(cfg(128), 1.5, tokens=tokens), row(cfg(16, 64), None, tokens=tokens, status="crash")]
    fill(db, rows)
    result = export(db, out)
    assert result.problems == []
    assert len(result.files) == 2 and all(c.status == "added" for f in result.files for c in f.changes)
    dev, arch = read(out), read(out, device=None)
    assert dev["entries"] == arch["entries"]
    assert arch["device"] is None and arch["device_names"] == [DEVICE] == dev["device_names"]
    got = by_density(dev)
    assert {d: e["config"] for d, e in got.items()} == {0.25: cfg(16), 1.0: cfg(32), 4.0: cfg(64, 128, 8)}
    e = got[1.0]
    assert (e["time_ms"], e["default_ms"], e["speedup"], e["tokens"], e["routes"], e["points"]) == \
        (1.0, 2.0, 2.0, 4, 8, 1)
    assert dev["candidates"] == {"measured": 12, "ok": 9, "rejected": {"crash": 3}}
    assert dev["versions"] == {"moetune": "0.1.0", "triton": "3.6.0", "torch": "2.11.0", "cuda": "12.8"}
    assert dev["strategy"] == ["exhaustive"] and dev["default"] == DEFAULT


def test_a_stores_csv_export_exports_the_same_tables(tmp_path):
    from typer.testing import CliRunner

    from moetune.cli import app

    db = tmp_path / "r.sqlite"
    rows = []
    for tokens, best in ((1, cfg(16)), (16, cfg(64, 128, 8))):
        rows += [row(DEFAULT, 2.0, tokens=tokens), row(best, 1.0, tokens=tokens),
                 row(cfg(16, 64), None, tokens=tokens, status="crash")]
    fill(db, rows)
    csv = tmp_path / "r.csv.gz"
    res = CliRunner().invoke(app, ["results", "--db", str(db), "--csv", str(csv), "--limit", "0"])
    assert res.exit_code == 0, res.output
    a, b = export(db, tmp_path / "a"), export(csv, tmp_path / "b")
    assert a.problems == b.problems == []
    for fa in sorted((tmp_path / "a").rglob("*.json")):
        assert fa.read_text() == (tmp_path / "b" / fa.relative_to(tmp_path / "a")).read_text()
    assert read(tmp_path / "b")["versions"]["cuda"] == "12.8"  # text columns stay text


def test_best_within_noise_of_the_default_keeps_the_default(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, spread=0.05), row(cfg(16), 1.96, spread=0.05),
              row(DEFAULT, 2.0, tokens=16, spread=0.01), row(cfg(16), 1.9, tokens=16, spread=0.01)])
    assert export(db, out).problems == []
    got = by_density(read(out))
    assert got[1.0]["config"] == DEFAULT and got[1.0]["speedup"] == 1.0
    assert got[4.0]["config"] == cfg(16) and got[4.0]["speedup"] == pytest.approx(2.0 / 1.9, rel=1e-3)


def test_rows_older_than_a_key_count_as_its_default_and_pool_with_new_ones(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    old_default = {k: v for k, v in DEFAULT.items() if k != "num_warps"}  # stored before num_warps existed
    old_best = {k: v for k, v in cfg(16, w=8).items() if k != "num_warps"}
    fill(db, [row(old_default, 2.0), row(old_best, 1.0), row(cfg(16, w=8), 1.2), row(cfg(32), 1.5)])
    assert export(db, out).problems == []
    doc = read(out)
    (e,) = doc["entries"]
    assert e["config"] == cfg(16, w=8) and e["default_ms"] == 2.0  # the default found in its old form
    assert e["time_ms"] == pytest.approx(1.1, rel=0.1)  # old and new rows of one config pooled
    assert doc["candidates"]["measured"] == 4 and doc["candidates"]["ok"] == 4


def test_several_stores_pool_their_rows(tmp_path):
    """A new sweep's store beside an older one's: rows of both compete, as if in one store."""
    old, new, out = tmp_path / "old.sqlite", tmp_path / "new.sqlite", tmp_path / "configs"
    fill(old, [row(DEFAULT, 2.0), row(cfg(16), 1.5),
               row(DEFAULT, 2.0, tokens=16), row(cfg(16), 1.0, tokens=16)])
    fill(new, [row(DEFAULT, 2.0), row(cfg(32), 1.0), row(cfg(32), 1.8, tokens=16)])
    result = export([old, new], out)
    assert result.problems == []
    got = by_density(read(out))
    assert got[1.0]["config"] == cfg(32) and got[1.0]["default_ms"] == 2.0  # found only in the new store
    assert got[4.0]["config"] == cfg(16)  # the old store's best still wins where the new one is slower
    assert read(out)["candidates"]["measured"] == 7


def test_ties_within_noise_go_to_the_lower_spread(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.00, spread=0.10), row(cfg(32), 1.02, spread=0.01),
              row(cfg(128), 1.3, spread=0.0)])
    export(db, out)
    assert by_density(read(out))[1.0]["config"] == cfg(32)


def test_a_wild_spread_does_not_tie_a_fast_config_with_a_slow_steady_one(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"  # the gpt-oss-120b H200 case: 0.93 (61%) vs 1.19
    fill(db, [row(DEFAULT, 2.0, spread=0.01), row(cfg(16), 0.93, spread=0.61),
              row(cfg(32), 1.19, spread=0.003)])
    export(db, out)
    assert by_density(read(out))[1.0]["config"] == cfg(16)


def test_a_config_inaccurate_anywhere_is_never_exported(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, tokens=1), row(cfg(16), 0.5, tokens=1), row(cfg(32), 1.0, tokens=1),
              row(DEFAULT, 2.0, tokens=4), row(cfg(16), 0.5, tokens=4, status="inaccurate", error=0.3)])
    export(db, out)
    got = by_density(read(out))
    assert got[0.25]["config"] == cfg(32) and got[1.0]["config"] == DEFAULT


def test_repeats_and_gpus_of_one_name_merge_other_names_stay_apart(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0), row(cfg(16), 1.2), row(cfg(16), 1.1),  # one name
              row(DEFAULT, 2.0, device="NVIDIA Other"), row(cfg(32), 1.0, device="NVIDIA Other")])
    result = export(db, out)
    assert len(result.files) == 3  # two device tables, one arch table
    mine = by_density(read(out))[1.0]
    assert mine["time_ms"] == pytest.approx(1.0)  # the fastest of the repeats' medians
    assert by_density(read(out, device="NVIDIA Other"))[1.0]["config"] == cfg(32)
    # the arch table comes from the device with the most accurate measurements ...
    assert by_density(read(out, device=None))[1.0]["device"] == DEVICE
    # ... unless told otherwise
    export(db, out, arch_device="NVIDIA Other")
    arch = read(out, device=None)
    assert by_density(arch)[1.0]["config"] == cfg(32) and arch["device_names"] == ["NVIDIA Other"]


def test_one_disturbed_repeat_does_not_tie_everything_with_the_default(tmp_path):
    """A repeat whose own spread is wild but whose median agrees with its twin (seen on the H200) keeps
    the twin's noise band: a config at half the default's time still wins."""
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, spread=0.01), row(DEFAULT, 2.04, spread=4.4), row(cfg(16), 1.0, spread=0.01)])
    assert export(db, out).problems == []
    got = by_density(read(out))[1.0]
    assert got["config"] == cfg(16) and got["spread"] < 0.05


def test_a_run_slowed_by_interference_does_not_decide_an_entry(tmp_path):
    """Interference only slows a run: of several readings of a config, the fastest counts, even when
    most are slow (an H200 sweep read the fp4 heuristic at 1.3-1.4x its time twice while the compile
    workers shared the GPU)."""
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, spread=0.01), row(cfg(16), 1.5, spread=0.01), row(cfg(16), 1.45, spread=0.02),
              row(cfg(16), 1.0, spread=0.01), row(cfg(32), 1.2, spread=0.01)])
    got = by_density(read(out)) if export(db, out).problems == [] else {}
    assert got[1.0]["config"] == cfg(16) and got[1.0]["time_ms"] == pytest.approx(1.0)
    assert got[1.0]["spread"] < 0.05


def test_points_of_one_density_form_one_entry(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    # 4 tokens at full activity and 8 tokens with half the routes active: both 8 routes, density 1
    fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0), row(cfg(32), 1.1),
              row(DEFAULT, 2.2, tokens=8, active_fraction=0.5),
              row(cfg(16), 1.5, tokens=8, active_fraction=0.5),
              row(cfg(32), 1.0, tokens=8, active_fraction=0.5),
              row(DEFAULT, 2.0, routing="zipf:1.2"), row(cfg(32), 1.0, routing="zipf:1.2")])
    export(db, out)
    (e,) = read(out)["entries"]
    # decided where the entry reports: 4 tokens, all active, uniform (cfg(32) wins a geomean over all
    # three points, but those are points cfg(16) was not all measured at in a real sweep)
    assert e["config"] == cfg(16) and e["points"] == 1
    assert (e["tokens"], e["active_fraction"], e["routing"]) == (4, 1.0, "uniform")


def test_a_config_seen_only_at_a_skewed_or_partly_active_point_does_not_win(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0),
              row(DEFAULT, 2.0, routing="zipf:1.2"), row(cfg(16), 1.6, routing="zipf:1.2"),
              row(cfg(32), 0.5, routing="zipf:1.2"),  # 4x the default, but never timed at uniform
              row(DEFAULT, 2.2, tokens=8, active_fraction=0.5),
              row(cfg(64), 0.4, tokens=8, active_fraction=0.5)])
    export(db, out)
    (e,) = read(out)["entries"]
    assert e["config"] == cfg(16) and e["points"] == 1
    assert (e["tokens"], e["active_fraction"], e["routing"], e["time_ms"]) == (4, 1.0, "uniform", 1.0)


def test_a_density_without_a_full_uniform_point_is_decided_at_its_most_typical_one(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, routing="zipf:1.2"), row(cfg(16), 0.5, routing="zipf:1.2"),
              row(DEFAULT, 2.0, tokens=8, active_fraction=0.5),
              row(cfg(32), 1.2, tokens=8, active_fraction=0.5)])
    export(db, out)
    (e,) = read(out)["entries"]  # uniform routing ranks before the larger active fraction
    assert e["config"] == cfg(32) and e["points"] == 1 and e["active_fraction"] == 0.5


def test_a_typical_point_with_nothing_accurate_hands_the_entry_to_the_next_one(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, status="inaccurate"), row(cfg(16), 1.0, status="inaccurate"),
              row(DEFAULT, 2.0, routing="zipf:1.2", status="inaccurate"),
              row(cfg(32), 1.5, routing="zipf:1.2"), row(cfg(64), 1.2, routing="zipf:1.2")])
    export(db, out)
    (e,) = read(out)["entries"]
    assert e["config"] == cfg(64) and e["routing"] == "zipf:1.2" and e["default_ms"] is None


def test_a_shape_with_no_accurate_measurement_is_a_note_not_a_file(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, None, status="timeout"), row(cfg(16), 1.0, status="inaccurate", error=0.4)])
    result = export(db, out)
    assert result.files == [] and result.problems == []
    assert result.notes and "no accurate measurement" in result.notes[0]
    assert not out.exists()


def test_without_a_default_measurement_the_best_is_exported_without_speedup(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(cfg(16), 1.0), row(cfg(32), 1.5)])
    export(db, out)
    (e,) = read(out)["entries"]
    assert e["config"] == cfg(16) and e["default_ms"] is None and e["speedup"] is None


def test_re_export_merges_and_reports_changes(tmp_path):
    db1, db2, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "configs"
    fill(db1, [row(DEFAULT, 2.0, tokens=1), row(cfg(16), 1.0, tokens=1),
               row(DEFAULT, 2.0, tokens=4), row(cfg(32), 1.0, tokens=4)])
    export(db1, out)
    fill(db2, [row(DEFAULT, 2.0, tokens=4), row(cfg(32, 64), 0.5, tokens=4),
               row(DEFAULT, 2.0, tokens=16), row(cfg(64), 1.0, tokens=16)])
    result = export(db2, out)
    dev = next(f for f in result.files if f.path.parent.name == "nvidia_toy_9000")
    assert {c.density: c.status for c in dev.changes} == {0.25: "kept", 1.0: "changed", 4.0: "added"}
    assert {d: e["config"] for d, e in by_density(read(out)).items()} == \
        {0.25: cfg(16), 1.0: cfg(32, 64), 4.0: cfg(64)}
    again = export(db2, out)
    assert {c.status for f in again.files for c in f.changes} == {"kept", "unchanged"}


def test_bad_rows_are_reported_by_row_and_field_and_the_rest_exports(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    ids = fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0),
                    row(cfg(16), 1.0, kernel="nope.kernel"),
                    row(cfg(16), 1.0, device="../../etc"),
                    row(cfg(16), float("nan")),
                    row(cfg(16), -1.0),
                    row({"BLOCK_SIZE_M": 17}, 1.0),
                    row(cfg(16), 1.0, arch="SM 90"),
                    row(cfg(16), 1.0, error=float("inf"))])
    result = export(db, out)
    text = "\n".join(result.problems)
    for rid, fld in zip(ids[2:], ["kernel", "device_name", "time_ms", "time_ms", "config", "arch", "error"],
                        strict=True):
        assert f"row {rid}: field {fld}:" in text
    assert all(p.startswith(str(db)) for p in result.problems)
    assert by_density(read(out))[1.0]["config"] == cfg(16)
    assert not list(out.rglob("*etc*"))


def test_a_corrupt_existing_table_is_reported_and_left_alone(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0)])
    path = tables.table_path(out, "sm_90", KERNEL, SHAPE, device=DEVICE)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": "moetune-table", "version": 7}')
    result = export(db, out)
    assert any(str(path) in p and "version" in p for p in result.problems)
    assert path.read_text() == '{"format": "moetune-table", "version": 7}'
    assert read(out, device=None)["entries"][0]["config"] == cfg(16)  # the arch table still written


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError):
        export(tmp_path / "missing.sqlite", tmp_path)
    fill(tmp_path / "r.sqlite", [row(DEFAULT, 2.0)])
    with pytest.raises(ValueError, match="unknown kernel"):
        export(tmp_path / "r.sqlite", tmp_path, kernels=["nope.kernel"])
    assert export(tmp_path / "r.sqlite", tmp_path / "c", kernels=["toy"]).files  # a family name
    assert export(tmp_path / "r.sqlite", tmp_path / "d", kernels=["gather_rows"]).files == []
    with pytest.raises(ValueError, match="--device"):
        export(tmp_path / "r.sqlite", tmp_path, device="a/b")


def test_export_then_pick_round_trip(tmp_path, monkeypatch):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, tokens=1), row(cfg(16), 1.0, tokens=1),
              row(DEFAULT, 2.0, tokens=16), row(cfg(64, 128, 8), 1.0, tokens=16)])
    export(db, out)
    monkeypatch.setenv(picker.ENV_VAR, str(out))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    try:
        lo = picker.pick_config_with_source(KERNEL, SHAPE, 2, device=H)
        hi = picker.pick_config_with_source(KERNEL, SHAPE, 40, device=H)
        assert (lo.source, dict(lo.config), lo.density_key) == ("device", cfg(16), 0.25)
        assert (hi.source, dict(hi.config), hi.density_key) == ("device", cfg(64, 128, 8), 4.0)
        # between the keys (log-midpoint of 0.25 and 4 is 1): the lower one
        assert math.isclose(picker.pick_config_with_source(KERNEL, SHAPE, 8, device=H).density_key, 0.25)
    finally:
        picker.clear_cache()


def test_broad_sweeps_on_two_cards_decide_by_the_config_robust_across_both(tmp_path, monkeypatch):
    """Where two sweeps each measured many configs at a point, the entry takes the config whose worst
    time over the sweeps, each over its own sweep's best, is lowest, not the fastest reading (which
    follows whichever card measured fastest). One broad sweep (or budgeted ones) keeps the usual rule."""
    import moetune.tuner.export as ex

    monkeypatch.setattr(ex, "CROSS_RUN_ROWS", 3)
    fast_card = {"x": 1.00, "y": 1.01, "z": 1.20, "d": 2.0}
    slow_card = {"x": 1.40, "y": 1.05, "z": 1.30, "d": 2.2}
    configs = {"x": cfg(16), "y": cfg(32), "z": cfg(64), "d": DEFAULT}
    one = [row(configs[k], t, sweep_id="a") for k, t in fast_card.items()]
    two = [row(configs[k], t, sweep_id="b", timestamp="2026-11-30T12:00:00Z") for k, t in slow_card.items()]
    db = tmp_path / "r.sqlite"
    fill(db, one + two)
    assert export(db, tmp_path / "both").problems == []
    got = by_density(read(tmp_path / "both"))[1.0]
    assert got["config"] == {**DEFAULT, **cfg(32)}  # worst 1.01 / 1.00 = 1.01, x's is 1.40 / 1.05
    assert got["time_ms"] == 1.01  # the entry still reports the config's fastest reading
    small = tmp_path / "s.sqlite"
    fill(small, one + two[:2])  # the second sweep measured too few configs to count
    assert export(small, tmp_path / "one").problems == []
    assert by_density(read(tmp_path / "one"))[1.0]["config"] == {**DEFAULT, **cfg(16)}
    budgeted = tmp_path / "m.sqlite"  # a model-strategy sweep does not vote, however many it measured
    fill(budgeted, one + [dict(r, strategy="model") for r in two])
    assert export(budgeted, tmp_path / "m").problems == []
    assert by_density(read(tmp_path / "m"))[1.0]["config"] == {**DEFAULT, **cfg(16)}


def test_a_forged_ok_row_over_the_tolerance_is_dropped_by_name(tmp_path):
    """The status is only what a row says: a store (or a CSV export of one) can be edited."""
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    ids = fill(db, [row(DEFAULT, 2.0), row(cfg(16), 1.0), row(cfg(32), 0.5, error=0.5),
                    row(cfg(128), 0.5, min_ms=float("-inf"))])
    csv = tmp_path / "r.csv"
    with Store(db) as s:
        s.frame().to_csv(csv, index=False)
    for source, dest in ((db, out), (csv, tmp_path / "from_csv")):
        result = export(source, dest)
        text = "\n".join(result.problems)
        assert f"row {ids[2]}: field error:" in text and "tolerance" in text, text
        assert f"row {ids[3]}: field min_ms:" in text, text
        assert by_density(read(dest))[1.0]["config"] == cfg(16)  # the forged faster rows never win


def test_rows_of_the_current_launch_contract_supersede_older_rows_at_their_point(tmp_path, monkeypatch):
    monkeypatch.setattr(type(SPEC), "launch_contract", lambda self, arch: "pdl")
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [
        # tokens 1: timed before the contract was recorded, then again under it: the new rows decide
        row(DEFAULT, 2.0, tokens=1), row(cfg(16), 1.0, tokens=1),
        row(DEFAULT, 2.0, tokens=1, launch="pdl"), row(cfg(16), 1.8, tokens=1, launch="pdl"),
        row(cfg(32), 1.2, tokens=1, launch="pdl"),
        # tokens 4: old rows only: they still decide
        row(DEFAULT, 2.0, tokens=4), row(cfg(64), 1.0, tokens=4),
        # tokens 16: another contract's rows never rank, even alone
        row(DEFAULT, 2.0, tokens=16, launch="plain"), row(cfg(128), 1.0, tokens=16, launch="plain"),
    ])
    got = by_density(read(export(db, out) and out))
    assert {d: e["config"] for d, e in got.items()} == {0.25: cfg(32), 1.0: cfg(64)}
    assert got[0.25]["time_ms"] == 1.2


def test_a_spec_with_one_launch_path_ranks_every_row(tmp_path):
    db, out = tmp_path / "r.sqlite", tmp_path / "configs"
    fill(db, [row(DEFAULT, 2.0, tokens=1), row(cfg(16), 1.0, tokens=1, launch="anything")])
    assert by_density(read(export(db, out) and out))[0.25]["config"] == cfg(16)
