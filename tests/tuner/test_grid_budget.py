"""The grid budget: its allocation rule on synthetic points, a strategy extended mid-search, a sweep
through the interpreter and the parallel driver, and replay with ``--grid-budget``."""

import collections
import json

import crashy_spec
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.device import INTERPRETER
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.tuner import grid_budget
from moetune.tuner.api import sweep_budget
from moetune.tuner.grid_budget import (
    BOUNDARY,
    DESIGN,
    FIRST_MIN,
    NEIGHBOURS,
    PRIOR,
    GridBudget,
    Reading,
    allocate,
    disagreements,
    first_pass,
)
from moetune.tuner.parallel import ParallelSweep
from moetune.tuner.replay import RefPoint, replay
from moetune.tuner.store import Store
from moetune.tuner.strategies import STRATEGIES, Observation, SearchContext, get_strategy
from moetune.tuner.strategies.prior import PriorData, PriorGuided
from moetune.tuner.sweep import plan_point

LANDSCAPE = crashy_spec.LANDSCAPE
TOKENS = (1, 2, 3, 4, 6)  # test.landscape: v 3 is fast at 3 tokens, v 7 at the others


def read(density, times, series="a", designs=None, prior_top=None, used=10, room=100):
    return Reading(series, density, times, designs or dict.fromkeys(times, ""), prior_top, used, room)


# ---- the rule -------------------------------------------------------------------------------------------
def test_a_point_that_agrees_with_neither_neighbour_is_flagged():
    others = {"A": 1.0, "B": 1.5}
    points = [read(1, others), read(2, others), read(3, {"B": 1.0, "A": 1.2}), read(4, others),
              read(5, others)]
    assert disagreements(points) == [(), (), (NEIGHBOURS,), (), ()]


def test_a_boundary_between_two_winners_is_not_a_disagreement():
    a, b = {"A": 1.0, "B": 1.5}, {"B": 1.0, "A": 1.5}
    assert disagreements([read(1, a), read(2, a), read(3, b), read(4, b)]) == [()] * 4


def test_a_neighbours_best_within_the_tie_agrees():
    others = {"A": 1.0, "B": 1.5}
    close = {"B": 1.0, "A": 1.005}  # the neighbours' best reads within 1% here: one config serves all
    assert disagreements([read(1, others), read(2, close), read(3, others)]) == [()] * 3


def test_an_end_point_has_one_side_and_a_lone_point_none_to_agree_with():
    two = [read(1, {"A": 1.0, "B": 2.0}), read(2, {"B": 1.0, "A": 2.0})]
    assert disagreements(two) == [(NEIGHBOURS,)] * 2
    assert disagreements([read(1, {"A": 1.0})]) == [(NEIGHBOURS,)]  # a one-point sweep spends it all there
    assert disagreements([read(1, {}), read(2, {"A": 1.0})]) == [(NEIGHBOURS,), (NEIGHBOURS,)]  # none found


def test_neighbours_are_the_nearest_other_densities_of_the_same_series():
    a, b = {"A": 1.0, "B": 2.0}, {"B": 1.0, "A": 2.0}
    # a twin at the same density (another active share) and another series' point are no neighbours
    # (nor a point beyond the nearest density on a side: 8 lies beyond 3)
    points = [read(1, a), read(2, b), read(2, b), read(3, a), read(2, b, series="other"), read(8, b)]
    assert disagreements(points)[1:3] == [(NEIGHBOURS,)] * 2


def test_a_point_the_design_changes_across_is_flagged():
    designs = {"A": "route", "B": "route", "C": "grouped"}
    left, right = {"A": 1.0, "B": 1.1, "C": 2.0}, {"C": 1.0, "A": 2.0, "B": 2.0}
    # the middle point agrees with its right neighbour, but its left one won with another design
    points = [read(1, left, designs=designs), read(2, right, designs=designs),
              read(4, right, designs=designs)]
    assert disagreements(points) == [(NEIGHBOURS,), (BOUNDARY,), ()]
    tiles = {"B": 1.0, "A": 1.1, "C": 2.0}  # the best's tiles change on one side, its design does not
    assert disagreements([read(1, tiles, designs=designs), read(2, left, designs=designs),
                          read(4, left, designs=designs)])[1] == ()


def test_a_best_outside_the_priors_first_picks_is_flagged():
    times = {"A": 1.0, "B": 1.5}
    agree = [read(1, times), read(3, times)]
    assert disagreements([*agree, read(2, times, prior_top=["B", "C"])])[2] == (PRIOR,)
    assert disagreements([*agree, read(2, times, prior_top=["C", "A"])])[2] == ()
    assert disagreements([*agree, read(2, times, prior_top=None)])[2] == ()  # no prior: no verdict


def test_another_designs_close_runner_up_is_flagged():
    designs = {"A": "route", "B": "grouped", "C": "route"}
    agree = [read(1, {"A": 1.0}), read(3, {"A": 1.0})]
    assert disagreements([*agree, read(2, {"A": 1.0, "B": 1.02}, designs=designs)])[2] == (DESIGN,)
    assert disagreements([*agree, read(2, {"A": 1.0, "B": 1.05}, designs=designs)])[2] == ()
    assert disagreements([*agree, read(2, {"A": 1.0, "C": 1.001}, designs=designs)])[2] == ()  # same design


def test_allocation_goes_to_flagged_points_by_their_room():
    a, b = {"A": 1.0, "B": 2.0}, {"B": 1.0, "A": 2.0}
    points = [read(1, a, room=100), read(2, b, room=100), read(3, a, room=300), read(4, a, room=300),
              read(5, b, series="s", room=200, prior_top=["A"]), read(6, b, series="s", room=100)]
    assert [bool(w) for w in disagreements(points)] == [True, True, False, False, True, False]
    assert allocate(points, 140) == [35, 35, 0, 0, 70, 0]  # a quarter of the pool per 100 of room
    tight = [read(1, a, room=12), read(2, b, room=300)]  # 2 left at the first: the rest to the second
    assert allocate(tight, 100) == [2, 98]
    assert allocate(tight, 1000) == [2, 290]  # past every flagged point's room: left unspent
    assert allocate(points, 0) == allocate(points, -5) == [0] * 6
    assert allocate([read(1, a), read(2, a)], 50) == [0, 0]


def test_grid_budget_parsing_and_totals():
    assert GridBudget.parse("5%") == GridBudget(share=0.05)
    assert GridBudget.parse(" 400 ") == GridBudget(count=400)
    for bad in ("x", "0", "-2%", "%", "1.5"):
        with pytest.raises(ValueError, match="--grid-budget"):
            GridBudget.parse(bad)
    assert GridBudget(share=0.05).total([100, 301]) == 21
    assert GridBudget(count=50).total([100, 300]) == 50
    prior = STRATEGIES["prior"]  # its per-point defaults: 5% of a point's candidates, at least 30
    assert GridBudget().total([100, 3000], prior) == 30 + 150
    with pytest.raises(ValueError, match="at least one"):
        GridBudget(count=2).total([10, 10, 10])


def test_first_pass_shares():
    assert first_pass([100, 1000, 5000], 10_000) == [FIRST_MIN, 20, 100]
    assert first_pass([3, 1000], 10_000) == [4, 20]  # a small space: every candidate and the default
    assert first_pass([100, 100], 10) == [5, 5]  # never beyond the even share of a tight grid budget


def test_the_default_sweep_spends_a_grid_budget():
    assert sweep_budget("prior", None, None) == GridBudget(share=0.012)
    assert sweep_budget("model", None, None) == GridBudget()
    assert sweep_budget("model", None, "3%") == GridBudget(share=0.03)
    assert sweep_budget("prior", 40, None) is None  # a per-point budget as before
    assert sweep_budget("exhaustive", None, None) is None  # every candidate, as before
    with pytest.raises(ValueError, match="exclude each other"):
        sweep_budget("prior", 40, "5%")


# ---- a strategy extended ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["model", "coordinate", "random"])
def test_an_extended_search_goes_on_from_its_first_pass(name):
    point = plan_point(LANDSCAPE, LANDSCAPE.problem(LANDSCAPE.shape_from_model(get_model("tiny")), 2),
                       INTERPRETER)
    s = get_strategy(name)
    s.start(SearchContext(point.spec, point.problem, point.candidates, budget=10, seed=1))

    def drain():
        out = []
        while batch := s.propose(4):
            out += batch
            s.observe([Observation(c, "ok", 1.0 + abs(c["v"] - 30) / 10, 0.01) for c in batch])
        return out

    first = drain()
    history = list(s.history)
    s.set_budget(30)
    second = drain()
    keys = [canonical_json(c) for c in first + second]
    assert len(keys) == len(set(keys))  # nothing proposed twice across the passes
    assert second and s.history[:len(history)] == history  # the first pass's readings are kept
    finals = s.remeasure() if hasattr(s, "remeasure") else []
    assert len(keys) + len(finals) <= 30


@pytest.mark.parametrize("name", ["model", "prior"])
def test_a_first_pass_is_the_start_of_the_search_it_plans_for(name):
    """Stopped at 8 measurements, a search planned for 40 has proposed what a search of 40 proposes first."""
    point = plan_point(LANDSCAPE, LANDSCAPE.problem(LANDSCAPE.shape_from_model(get_model("tiny")), 2),
                       INTERPRETER)

    def proposals(**budget):
        s = PriorGuided(PriorData()) if name == "prior" else get_strategy(name)
        s.start(SearchContext(point.spec, point.problem, point.candidates, seed=3, **budget))
        out = []
        while batch := s.propose(256):
            out += [c["v"] for c in batch]
            s.observe([Observation(c, "ok", 1.0 + abs(c["v"] - 30) / 10, 0.01) for c in batch])
        return out

    first, flat = proposals(budget=8, plan=40), proposals(budget=40)
    assert len(first) == 8 and first == flat[:8]
    assert proposals(budget=8) != first  # planned for 8 alone, its phases come sooner


# ---- a sweep ---------------------------------------------------------------------------------------------
def test_sweep_spends_the_grid_budget_where_a_point_disagrees(tmp_path):
    """Through the interpreter: every point's first pass measures v 0..7, the point whose best differs
    from both neighbours' (3 tokens) gets the rest of the grid budget, the others nothing more."""
    db = tmp_path / "g.sqlite"
    res = CliRunner().invoke(app, ["sweep", "--kernel", "test.landscape", "--model", "tiny", "--tokens",
                                   ",".join(map(str, TOKENS)), "--strategy", "exhaustive", "--grid-budget",
                                   "70", "--db", str(db), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "grid budget 70 (70 measurements): first pass at every point, 30 more at 1 of 5" in res.output
    with Store(db) as s:
        rows = s.frame()
    per = rows.groupby("tokens")["config"].nunique().to_dict()
    assert per == {1: 8, 2: 8, 3: 38, 4: 8, 6: 8} and len(rows) == 70
    best = rows.loc[rows.groupby("tokens")["time_ms"].idxmin()]
    found = {t: json.loads(c)["v"] for t, c in zip(best["tokens"], best["config"], strict=True)}
    assert found == {t: LANDSCAPE.fast(t) for t in TOKENS}


def test_budget_and_grid_budget_exclude_each_other(tmp_path):
    res = CliRunner().invoke(app, ["sweep", "--kernel", "test.steady", "--model", "tiny", "--budget", "4",
                                   "--grid-budget", "5%", "--db", str(tmp_path / "x.sqlite")])
    assert res.exit_code == 2 and "exclude each other" in res.output
    assert not (tmp_path / "x.sqlite").exists()


class LandscapeBackend:
    """Measuring workers that answer at once with test.landscape's times (no processes)."""

    def __init__(self, n=3):
        self.workers = [f"w{i}" for i in range(n)]
        self.device, self.versions, self.timeout, self.timing = INTERPRETER, {}, 1.0, {}
        self.queue = collections.deque()

    def capacity(self):
        return len(self.workers) - len(self.queue)

    def submit(self, key, task, label=""):
        self.queue.append((key, task))

    def poll(self):
        key, task = self.queue.popleft()
        fast = task["config"]["v"] == LANDSCAPE.fast(task["problem"].tokens)
        return [(key, {"status": "ok", "time_ms": 1.0 if fast else 8.0, "n_runs": 1}, self.workers[0])]


@pytest.mark.parametrize("strategy", ["exhaustive", "model"])
def test_the_parallel_driver_runs_both_passes(tmp_path, monkeypatch, strategy):
    problems = [LANDSCAPE.problem(LANDSCAPE.shape_from_model(get_model("tiny")), t) for t in TOKENS]
    if strategy == "model":  # its 7 first-pass picks rarely find v 7: say 3 tokens disagrees, to follow it
        monkeypatch.setattr(grid_budget, "disagreements",
                            lambda readings: [(NEIGHBOURS,) if i == 2 else () for i in range(len(readings))])
    events = []
    with Store(tmp_path / "p.sqlite") as store:
        sweep = ParallelSweep(store, LandscapeBackend(), strategy=strategy, grid_budget=GridBudget(count=70),
                              on_event=lambda kind, **data: events.append((kind, data.get("total"))))
        points = sweep.run(problems)
        rows = store.frame()
    assert len(rows) <= 70 and sum(pt.budget for pt in points) <= 70
    assert ("second_pass", sum(pt.extra for pt in points)) in events
    at = rows.groupby("tokens").size().to_dict()
    assert all(at[pt.problem.tokens] <= pt.budget for pt in points)  # the finals included
    if strategy == "exhaustive":  # every first pass measures v 0..7: 3 tokens disagrees, alone
        assert [pt.extra for pt in points] == [0, 0, 30, 0, 0] and at[3] == 38
        assert all(pt.best.config["v"] == LANDSCAPE.fast(pt.problem.tokens) for pt in points)
    else:  # the search goes on from its first pass; its finals come after the second
        assert [pt.extra for pt in points] == [0, 0, 30, 0, 0]
        here = rows[rows["tokens"] == 3]
        searched = here[here["strategy"] != "remeasure"]
        assert searched["config"].is_unique and len(searched) > 8
        finals = here[here["strategy"] == "remeasure"]
        assert len(finals) and finals["id"].min() > searched["id"].max()


# ---- replay ----------------------------------------------------------------------------------------------
def _landscape_points(far):
    """Synthetic exhaustive points of test.landscape: v 7 fastest except at 3 tokens, where v ``far`` is
    (beyond a first pass and a flat budget); slower configs slow by v, so each point has one best."""
    shape = LANDSCAPE.shape_from_model(get_model("tiny"))
    configs = [{**LANDSCAPE.default, "v": v} for v in range(48)]
    out = []
    for t in TOKENS:
        fast = far if t == 3 else 7
        times = np.array([1.0 if v == fast else 2.0 + 0.01 * v for v in range(48)])
        p = LANDSCAPE.problem(shape, t)
        out.append(RefPoint(LANDSCAPE.name, "cpu", shape, t, p.routes, 1.0, "uniform", configs,
                            ["ok"] * 48, times, np.full(48, 0.01), LANDSCAPE.default))
    return out


def test_replay_with_a_grid_budget_finds_what_a_flat_one_misses():
    points = _landscape_points(far=30)
    flat = replay(points, ["exhaustive"], ["14"], seeds=1, batch=8, noise=0.0)
    grid = replay(points, ["exhaustive"], ["14"], seeds=1, batch=8, noise=0.0, grid=True)
    assert set(grid["budget"]) == {"14 grid"} and (flat["extra"] == 0).all()
    assert grid["measurements"].sum() == flat["measurements"].sum() == 70  # the same total
    assert (grid["extra"] > 0).sum() == 1 and grid.loc[grid["extra"] > 0, "why"].item() == NEIGHBOURS
    assert grid["quality"].max() == 1.0 and flat["quality"].max() > 1.5  # the far best found


def test_cli_replay_grid_budget_reports_the_second_pass(tmp_path):
    out = tmp_path / "runs.csv"
    res = CliRunner().invoke(app, ["replay", "--data", "tests/data/toy_landscape.csv.gz", "--strategy",
                                   "model", "--budget", "10%", "--seeds", "1", "--batch", "8", "--quiet",
                                   "--grid-budget", "--csv", str(out)])
    assert res.exit_code == 0, res.output
    runs = pd.read_csv(out)
    assert set(runs["budget"]) == {"10% grid"} and "extra" in runs
    assert runs["measurements"].sum() <= np.ceil(0.1 * runs["exhaustive"].sum())
