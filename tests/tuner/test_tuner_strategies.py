"""Strategy interface: exhaustive and random cover the constrained list once, within the budget."""

import pytest

from moetune.device import INTERPRETER
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.sweep import plan_point


@pytest.fixture
def point():
    spec = get_spec("gather_rows")
    return plan_point(spec, spec.problem({"E": 8, "K": 256, "top_k": 2}, 4), INTERPRETER)


def drain(strategy, ctx, batch, fake_time=lambda c: 1.0):
    strategy.start(ctx)
    proposed = []
    while True:
        b = strategy.propose(batch)
        if not b:
            return proposed
        proposed += b
        strategy.observe([Observation(c, "ok", fake_time(c), 0.01) for c in b])


@pytest.mark.parametrize("name", ["exhaustive", "random"])
@pytest.mark.parametrize("batch", [1, 7])
def test_covers_every_candidate_once(point, name, batch):
    ctx = SearchContext(point.spec, point.problem, point.candidates)
    keys = [canonical_json(c) for c in drain(get_strategy(name), ctx, batch)]
    assert sorted(keys) == sorted(canonical_json(c) for c in point.candidates)


@pytest.mark.parametrize("name", ["exhaustive", "random"])
def test_budget_counts_stored_and_skips_them(point, name):
    stored = [Observation(point.candidates[3], "crash"), Observation(point.default, "ok", 2.0)]
    ctx = SearchContext(point.spec, point.problem, point.candidates, measured=stored, budget=6)
    got = drain(get_strategy(name), ctx, 4)
    assert len(got) == 4
    assert not {canonical_json(c) for c in got} & {o.key for o in stored}
    assert all(c in point.candidates for c in got)


def test_random_is_seeded(point):
    def order(seed):
        return drain(get_strategy("random"), SearchContext(point.spec, point.problem, point.candidates,
                                                           budget=10, seed=seed), 3)
    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(1) != point.candidates[:10]


def test_batches_in_flight_never_overlap(point):
    s = get_strategy("exhaustive")
    s.start(SearchContext(point.spec, point.problem, point.candidates, budget=5))
    a, b, c = s.propose(3), s.propose(3), s.propose(3)  # three GPUs ask before any result comes back
    assert len(a) == 3 and len(b) == 2 and c == []
    assert not {canonical_json(x) for x in a} & {canonical_json(x) for x in b}


def test_best_and_unknown_strategy(point):
    s = get_strategy("exhaustive")
    ctx = SearchContext(point.spec, point.problem, point.candidates, budget=4)
    drain(s, ctx, 2, fake_time=lambda c: c["num_warps"] * 1.0 + c["BLOCK_SIZE_K"] / 1e4)
    assert s.best().time_ms == min(o.time_ms for o in s.history if o.ok)
    with pytest.raises(ValueError, match="unknown strategy 'annealing'"):
        get_strategy("annealing")


def test_exhaustive_measures_the_warm_starts_among_its_candidates_first(point):
    """Hints first (a pruned one never), then space order; still every candidate exactly once."""
    last, first = point.candidates[-1], point.candidates[5]
    pruned = {**point.candidates[0], "BLOCK_SIZE_K": 12345}
    ctx = SearchContext(point.spec, point.problem, point.candidates, hints=[last, pruned, first])
    got = [canonical_json(c) for c in drain(get_strategy("exhaustive"), ctx, 4)]
    assert got[:2] == [canonical_json(last), canonical_json(first)]
    assert sorted(got) == sorted(canonical_json(c) for c in point.candidates)


@pytest.mark.parametrize("name", ["exhaustive", "random"])
def test_fixed_orders_look_at_each_candidate_once_per_search(point, name, monkeypatch):
    """A batch continues where the last one stopped: no candidate's key is computed again per batch
    (a 14304-candidate exhaustive sweep spent more time rescanning its order than measuring)."""
    from moetune.tuner.strategies import base

    keys = [canonical_json(c) for c in point.candidates]
    s = get_strategy(name)
    s.start(SearchContext(point.spec, point.problem, point.candidates, keys=keys))
    calls = []
    real = base.canonical_json
    monkeypatch.setattr(base, "canonical_json", lambda c: calls.append(1) or real(c))
    got = []
    while batch := s.propose(1):  # batches of one, as a driver with one free worker asks
        got += batch
    assert sorted(real(c) for c in got) == sorted(keys)
    assert calls == []  # the caller's keys, each looked at once
