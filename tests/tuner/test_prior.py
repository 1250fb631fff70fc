"""The prior strategy: learning across points, and leave-one-model-out replay that never leaks."""

import json

import numpy as np
import pandas as pd
import pytest
from strategy_landscape import write_dataset

from moetune.problem import Problem, canonical_json
from moetune.tuner import replay as rp
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.strategies.prior import PriorData, PriorGuided, model_key

X = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "num_warps": 8, "num_stages": 2,
     "MODE": "b"}
Y = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "num_warps": 4, "num_stages": 1,
     "MODE": "a"}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Model B (top_k 8, best X) to replay; model A (top_k 4, best Y) to learn from."""
    d = tmp_path_factory.mktemp("prior")
    a = write_dataset(d / "a.csv", points=((4, 4), (16, 4)), seed=3, best=Y)
    b = write_dataset(d / "b.csv", points=((16, 8),), seed=5, best=X)
    pd.concat([a, b]).to_csv(d / "both.csv", index=False)
    return d


def _first_proposal(point, data: PriorData, budget: int = 8):
    s = PriorGuided(data)
    s.start(SearchContext(None, point.problem, point.configs, budget=budget, seed=0))
    return s.propose(1)[0]


def test_first_proposals_are_the_winners_of_similar_points(stores):
    (b,) = rp.load_points(stores / "b.csv")
    learnt = PriorData.from_stores([stores / "a.csv"])
    assert len(learnt.sites) == 2
    assert _first_proposal(b, learnt) == Y  # model A's winner, though this point's best is X
    assert _first_proposal(b, PriorData.from_stores([stores / "b.csv"])) == X  # a site of this very point
    nothing = PriorData()  # no data: the model strategy's random sample
    assert _first_proposal(b, nothing) != Y


def test_prior_behind_the_interface_finds_what_a_near_point_knows(stores):
    (b,) = rp.load_points(stores / "b.csv")
    # a site at another density of the same shape whose best is X: a budget of 6 finds it
    data = PriorData.from_frame(pd.read_csv(stores / "b.csv").assign(routes=64, tokens=8))
    runs = [rp.replay_point(b, "prior", 6, seed, batch=2, prior=data) for seed in range(3)]
    assert all(r["winner"] == canonical_json(X) and r["measurements"] <= 6 for r in runs)
    assert isinstance(get_strategy("prior"), PriorGuided)


def test_points_of_one_sweep_share_one_model():
    data = PriorData()
    shape = {"E": 8, "N": 512, "K": 256, "top_k": 8}
    a, b = Problem("toy.gemm", shape, 16, 128), Problem("toy.gemm", shape, 32, 256)
    configs = [{"BLOCK_SIZE_N": n, "num_warps": w} for n in (32, 64, 128) for w in (4, 8)]
    index = {canonical_json(c): i for i, c in enumerate(configs)}
    assert not data.predict(b, index, len(configs))[1].any()
    data.add(a, [Observation(c, "ok", 1.0 + i, 0.01) for i, c in enumerate(configs)])
    score, weight = data.predict(b, index, len(configs))
    assert (weight > 0).all() and int(np.argmin(score)) == 0  # point a's fastest ranks first at b
    assert not data.predict(a, index, len(configs))[1].any()  # its own readings: its search's
    assert not data.sites and set(data.live) == {"toy.gemm|" + canonical_json(shape) + "|128|1|uniform"}


def test_model_key_pairs_the_ops_of_one_layer():
    gate_up = model_key("fp8_decode.gate_up", {"E": 256, "N": 512, "K": 7168, "top_k": 8})
    down = model_key("fp8_decode.down", {"E": 256, "N": 7168, "K": 256, "top_k": 8})
    other = model_key("fp8_decode.down", {"E": 256, "N": 7168, "K": 512, "top_k": 8})
    assert gate_up == down != other


def test_holdout_never_sees_the_held_out_model(stores, monkeypatch):
    """Train on both models' stores, replay model B: with the holdout B's own rows (best X) must not
    reach the prior, so its first proposal is model A's winner; without it, B's rows hand it X."""
    points = rp.load_points(stores / "b.csv")
    train = PriorData.from_stores([stores / "both.csv"])
    seen_sites, first = [], []
    start = PriorGuided.start

    def spy(self, ctx):
        start(self, ctx)
        seen_sites.append({model_key(s.kernel, s.shape) for s in self.data.sites.values()})
        first.append(self.propose(1)[0])

    monkeypatch.setattr(PriorGuided, "start", spy)
    for holdout, expected in ((True, Y), (False, X)):
        seen_sites.clear()
        first.clear()
        honesty = rp.Honesty(holdout=holdout, heuristic=False, train=train)
        rp.replay(points, ["prior"], ["8"], seeds=2, honesty=honesty)
        held_out = model_key(points[0].kernel, points[0].shape)
        assert all((held_out in sites) != holdout for sites in seen_sites)
        assert first == [expected, expected]


def test_per_model_grid_sums_its_points(stores):
    points = rp.load_points(stores / "a.csv")
    runs = rp.replay(points, ["model"], ["5%"], seeds=2)
    grid = rp.per_model(runs)
    assert len(grid) == 1 and grid["points"].iloc[0] == 2
    assert grid["measurements"].iloc[0] == pytest.approx(runs.groupby("point")["measurements"].mean().sum())
    assert grid["exhaustive"].iloc[0] == sum(len(p.configs) for p in points)
    assert grid["worst_point"].iloc[0] == pytest.approx(rp.per_point(runs)["quality"].max())


def test_holdout_turns_the_heuristic_off_and_says_so():
    h = rp.Honesty(holdout=True, heuristic=False, warm=True, train=PriorData())
    assert h.describe() == "leave-one-model-out, heuristic off, warm starts on, prior trained on 0 sites"
    assert json.loads(canonical_json(X)) == X


def test_a_search_refreshes_its_prior_as_other_points_report(stores):
    """Points searched at once: a search started before its neighbour measured anything picks up the
    neighbour's readings at its next proposal."""
    (b,) = rp.load_points(stores / "b.csv")
    data = PriorData()
    s = PriorGuided(data)
    s.start(SearchContext(None, b.problem, b.configs, budget=40, seed=0))
    assert s.prior_mean is None
    other = Problem(b.kernel, b.shape, 8, 64)  # another density of the same shape, best X
    data.add(other, [Observation(c, "ok", 0.1 if c == X else 0.2 + 0.001 * i, 0.01)
                     for i, c in enumerate(b.configs[:50] + [X])])
    assert s.propose(1) == [X]


def test_default_budget_is_a_twentieth():
    assert PriorGuided.planned(10_000, None) == 500 and PriorGuided.planned(100, None) == 30
    assert PriorGuided.planned(100, 7) == 7 and PriorGuided.planned(10, None) == 11


class _ModeSpec:
    """A spec whose designs are the values of MODE (the rest are tiles)."""

    def design(self, config):
        return config["MODE"]


def _contending_search():
    """Designs a (best 1.0) and b (best 1.1) contend, c (best 1.5) does not."""
    configs = [{"MODE": m, "BLOCK_SIZE_N": n, "num_warps": w}
               for m in "abc" for n in (32, 64, 128, 256) for w in (4, 8)]
    problem = Problem("toy.gemm", {"E": 8, "N": 512, "K": 256, "top_k": 8}, 16, 128)
    s = PriorGuided(PriorData())
    s.start(SearchContext(_ModeSpec(), problem, configs, budget=40, seed=0))
    times = {("a", 64, 4): 1.0, ("a", 128, 8): 1.3, ("b", 64, 4): 1.1, ("b", 256, 8): 1.2,
             ("c", 64, 4): 1.5}
    s.observe([Observation({"MODE": m, "BLOCK_SIZE_N": n, "num_warps": w}, "ok", t)
               for (m, n, w), t in times.items()])
    at = {k: s.space.index[canonical_json({"MODE": k[0], "BLOCK_SIZE_N": k[1], "num_warps": k[2]})]
          for k in times}
    return s, at


def test_the_designs_in_contention_are_those_near_the_best():
    s, at = _contending_search()
    rivals = s.contenders()
    assert list(rivals) == ["a", "b"]  # c's best reads 1.5x
    assert rivals["a"] == [at["a", 64, 4], at["a", 128, 8]]
    assert rivals["b"] == [at["b", 64, 4], at["b", 256, 8]]


def test_polish_takes_turns_over_the_designs_in_contention():
    s, at = _contending_search()
    near = {d: set(s.unmeasured(s.space.neighbours(at[d, 64, 4]))) for d in "abc"}
    moves = s.local_moves(2)
    # a step from a's best, then one from b's (the fastest of the runner-up design), and so on
    assert moves[0] in near["a"] and moves[1] in near["b"]
    assert set(moves) == near["a"] | near["b"]
    assert not set(moves) & (near["c"] - near["a"] - near["b"])


def test_model_picks_among_the_contenders_neighbours():
    s, at = _contending_search()
    pool = s.model_pool()
    expect = {j for k in (("a", 64, 4), ("a", 128, 8), ("b", 64, 4), ("b", 256, 8))
              for j in s.space.neighbours(at[k]) if s.space.candidates[j]["MODE"] != "c"}
    assert set(np.flatnonzero(pool)) == expect
    picks = s._model_picks(4)
    assert len(picks) == 4 and all(pool[i] and s.space.candidates[i]["MODE"] != "c" for i in picks)
