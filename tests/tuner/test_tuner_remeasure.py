"""The live sweep runs an adaptive strategy's final re-measurement, stores it tagged, and not twice."""

import crashy_spec

from moetune.models import get_model
from moetune.tuner.backends.process import Runner
from moetune.tuner.store import Store
from moetune.tuner.sweep import REMEASURE, Sweep

WIDE = crashy_spec.STEADY_WIDE


def test_model_strategy_remeasures_its_finalists_once(tmp_path):
    db = tmp_path / "r.sqlite"
    problems = [WIDE.problem(WIDE.shape_from_model(get_model("tiny")), 1)]
    with Store(db) as store, Runner(timeout=30) as runner:
        Sweep(store, runner, strategy="model", budget=40, seed=3).run(problems)
        rows = store.frame()
        again = Sweep(store, runner, strategy="model", budget=40, seed=3).run(problems)
        rows_after = store.frame()
    finals = rows[rows["strategy"] == REMEASURE]
    searched = rows[rows["strategy"] != REMEASURE]
    assert 2 <= finals["config"].nunique() <= len(finals)
    # Finalists are configs the search measured, and the best ones it found.
    assert set(finals["config"]) <= set(searched["config"])
    assert searched["config"].is_unique and len(searched) <= 40
    assert searched.loc[searched["time_ms"].idxmin(), "config"] in set(finals["config"])
    # Resume: nothing new, and no second round of re-measurements.
    assert len(rows_after) == len(rows) and sum(again[0].counts.values()) == 0
