"""The whole path on the interpreter: sweep -> store -> export -> verify (re-run) -> pick."""

from __future__ import annotations

import pytest

from moetune.device import INTERPRETER
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tables import format as tables
from moetune.tables import picker
from moetune.tuner.backends.process import Runner
from moetune.tuner.export import export
from moetune.tuner.store import Store
from moetune.tuner.sweep import Sweep
from moetune.tuner.verify import verify

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


def test_a_sweep_starts_from_the_stores_bests_at_other_densities(dirs):
    """A later sweep of another density offers each earlier point's best (nearest density first) as a
    warm start, though no table holds it yet."""
    db, spec = dirs / "s.sqlite", get_spec(KERNEL)
    with Store(db) as store, Runner(timeout=120, jobs=0) as runner:
        Sweep(store, runner, strategy="random", budget=3).run([spec.problem(SHAPE, t) for t in (1, 8)])
        frame = store.frame(kernel=KERNEL, status="ok")
        best = {r: frame[frame["routes"] == r].sort_values("time_ms")["config"].iloc[0] for r in (2, 16)}
        later = Sweep(store, runner)
        later.plan([spec.problem(SHAPE, 2)], INTERPRETER)  # routes 4, density 1
        hints = [canonical_json(c) for c in later._hints(0)]
    offered = [b for b in (best[2], best[16]) if b in later.points[0].keys]  # candidates at this point
    assert offered and all(b in hints for b in offered)
    if len(offered) == 2:  # density 0.5 is nearer to 1 than density 4
        assert hints.index(best[2]) <= hints.index(best[16])
