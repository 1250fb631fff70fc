"""The whole path on the interpreter: sweep -> store -> export -> verify (re-run) -> pick."""

from __future__ import annotations

import pytest

from moetune import picker, tables
from moetune.device import INTERPRETER
from moetune.export import export
from moetune.runner import Runner
from moetune.spec import canonical_json, get_spec
from moetune.store import Store
from moetune.sweep import Sweep
from moetune.verify import verify

KERNEL = "gather_rows"
SHAPE = {"E": 4, "N": 256, "K": 256, "top_k": 2}


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(picker.ENV_VAR, str(tmp_path / "configs"))
    monkeypatch.setattr(picker, "packaged_dirs", lambda: ())
    picker.clear_cache()
    yield tmp_path
    picker.clear_cache()


def test_sweep_export_verify_pick_round_trip(dirs):
    db, out = dirs / "r.sqlite", dirs / "configs"
    spec = get_spec(KERNEL)
    problems = [spec.problem(SHAPE, tokens) for tokens in (1, 8)]  # densities 0.5 and 4
    with Store(db) as store, Runner(timeout=120, jobs=0) as runner:
        Sweep(store, runner, strategy="exhaustive", budget=3).run(problems)
        frame = store.frame(kernel=KERNEL)
    assert set(frame["status"]) == {"ok"} and len(frame) >= 4

    result = export(db, out)
    assert result.problems == []
    arch_path = tables.table_path(out, "interpreter", KERNEL, spec.normalize_shape(SHAPE))
    doc = tables.read(arch_path)
    assert [e["density"] for e in doc["entries"]] == [0.5, 4.0]
    # what was exported is what the store says is best (or the default, within noise)
    for e in doc["entries"]:
        rows = frame[(frame["routes"] == e["routes"]) & (frame["status"] == "ok")]
        assert canonical_json(e["config"]) in set(rows["config"])
        assert e["time_ms"] <= rows["time_ms"].max()

    files, findings = verify([out], schema_only=False)  # re-runs every entry on the interpreter
    assert len(files) == 2
    assert [str(f) for f in findings if f.level == "error" and "slower" not in f.message] == []

    for routes, e in ((2, doc["entries"][0]), (16, doc["entries"][1])):  # each entry's own point
        p = picker.pick_config_with_source(KERNEL, SHAPE, routes, device=INTERPRETER)
        assert (p.source, dict(p.config), p.density_key) == ("device", e["config"], e["density"])

    # a later sweep between those densities starts from the tables' entries on either side of it
    sweep = Sweep(Store(dirs / "next.sqlite"), Runner(timeout=120, jobs=0))
    sweep.plan([spec.problem(SHAPE, 3)], INTERPRETER)  # density 1.5
    hints = [canonical_json(c) for c in sweep._hints(0)]
    assert picker.table_neighbours(KERNEL, SHAPE, 6, device=INTERPRETER) == [e["config"] for e in
                                                                             doc["entries"][::-1]]
    tabled = {canonical_json(e["config"]) for e in doc["entries"]} & sweep.points[0].keys  # candidates here
    assert tabled and tabled <= set(hints)
    sweep.store.close()
