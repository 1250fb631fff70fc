"""Adaptive strategies (coordinate, model, prior) replayed on stored and synthetic landscapes."""

import json
import math

import numpy as np
import pytest
from strategy_landscape import SPACE, write_dataset

from moetune.problem import canonical_json
from moetune.tuner.replay import load_points, replay, replay_point
from moetune.tuner.strategies import Observation, SearchContext, get_strategy
from moetune.tuner.strategies.features import Space
from moetune.tuner.strategies.model import GP, _norm_cdf, _norm_pdf

DATA = "tests/data/toy_landscape.csv.gz"
ADAPTIVE = ("coordinate", "model", "prior")


@pytest.fixture(scope="module")
def points():
    return load_points(DATA)


def test_data_loads_as_points(points):
    assert [p.tokens for p in points] == [1, 16]
    for p in points:
        assert len(p.configs) == len(p.index) > 500  # pruned configs are simply absent
        assert {"ok", "compile_error", "inaccurate"} <= set(p.status)
        assert p.best_ms == min(t for t, s in zip(p.time_ms, p.status, strict=True) if s == "ok")


@pytest.mark.parametrize("name", ADAPTIVE + ("random",))
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_budget_respected_and_only_fresh_candidates(points, name, batch):
    # replay_point raises on a config outside the point's candidates or one already measured
    for budget in (1, 7, 40):
        r = replay_point(points[1], name, budget, seed=0, batch=batch)
        assert r["measurements"] <= budget
        assert r["quality"] >= 1.0


@pytest.mark.parametrize("name", ADAPTIVE)
def test_never_proposes_pruned_or_measured(points, name):
    p = points[0]
    keep = p.configs[::2]  # pretend the constraints pruned every other config
    stored = [Observation(keep[0], "ok", 1.0, 0.01), Observation(keep[5], "crash")]
    s = get_strategy(name)
    s.start(SearchContext(None, p.problem, keep, stored, hints=[p.configs[1], keep[9]], budget=60, seed=1))
    allowed = {canonical_json(c) for c in keep}
    seen = {o.key for o in stored}
    while batch := s.propose(4):
        keys = [canonical_json(c) for c in batch]
        assert set(keys) <= allowed and not set(keys) & seen and len(set(keys)) == len(keys)
        seen.update(keys)
        s.observe([Observation(c, "ok", 1.0 + 0.01 * i, 0.01) for i, c in enumerate(batch)])
    assert len(seen) <= 60


@pytest.mark.parametrize("name", ADAPTIVE)
def test_reproducible_with_a_seed(points, name):
    def run(seed):
        return replay_point(points[1], name, 50, seed=seed, batch=4)

    assert run(3) == run(3)
    assert run(3)["winner"] is not None


def test_model_depends_on_the_seed(points):
    winners = {replay_point(points[1], "model", 20, seed=s)["winner"] for s in range(4)}
    assert len(winners) > 1 or replay_point(points[1], "model", 20, seed=0)["quality"] == 1.0


def test_coordinate_starts_from_the_hint(points):
    p = points[1]
    hint = p.configs[len(p.configs) // 2]
    s = get_strategy("coordinate")
    s.start(SearchContext(None, p.problem, p.configs, [], hints=[hint], budget=30))
    assert s.propose(4) == [hint]  # measured first, then its neighbours
    s.observe([Observation(hint, "ok", 1.0, 0.01)])
    nbrs = {canonical_json(p.configs[j]) for j in s.space.neighbours(p.index[canonical_json(hint)])}
    batch = s.propose(64)
    assert batch and {canonical_json(c) for c in batch} <= nbrs


def test_neighbours_are_one_step_along_one_parameter(points):
    space = Space(points[0].configs)
    i = len(points[0].configs) // 3
    base = space.candidates[i]
    for j in space.neighbours(i):
        diff = [k for k in base if base[k] != space.candidates[j][k]]
        assert len(diff) == 1
    assert space.features.shape[0] == len(space.candidates)
    assert np.all((space.features >= 0) & (space.features <= 1))


def test_believer_batch_equals_a_refit_per_pick():
    """The rank-one shortcut picks what refitting the GP with each pick at its predicted mean picks."""
    rng = np.random.default_rng(3)
    x, xs = rng.random((40, 4)), 0.2 * rng.random((300, 4))  # a crowded pool: picks interact
    y = np.sin(4 * x).sum(axis=1)
    y = (y - y.mean()) / y.std()
    scales, noise = np.array([0.3, 0.6, 1.2, 0.15]), 0.01
    gp = GP(scales, noise)
    gp.fit(x, y)
    fast, _ = gp.believer_picks(xs, y.min(), 40)
    slow, pool, xa, ya = [], list(range(len(xs))), x, y
    for _ in range(40):
        ref = GP(scales, noise)
        ref.fit(xa, ya)
        m, sd = ref.predict(xs[pool])
        z = (y.min() - m) / sd
        ei = (y.min() - m) * _norm_cdf(z) + sd * _norm_pdf(z)
        j = int(np.argmax(ei))
        slow.append(pool.pop(j))
        xa, ya = np.vstack([xa, xs[slow[-1]]]), np.append(ya, m[j])
    assert fast == slow


def test_polish_takes_several_neighbourhoods_best_first(points):
    strat = get_strategy("model")
    strat.start(SearchContext(None, points[0].problem, points[0].configs, budget=400, seed=0))
    times = {i: 1.0 + i for i in (5, 50, 100)}
    strat.observe([Observation(strat.space.candidates[i], "ok", t) for i, t in times.items()])
    first = strat.local_moves()
    assert first == strat.unmeasured(strat.space.neighbours(5))  # default: the fastest one's only
    more = strat.local_moves(len(first) + 1)
    assert more[:len(first)] == first and len(set(more)) == len(more) > len(first)
    assert set(more) <= set(first) | set(strat.space.neighbours(50)) | set(strat.space.neighbours(100))


def test_space_features_by_hand_and_keys_handed_in():
    configs = [{"BM": 16, "mode": "a", "w": 4}, {"BM": 64, "mode": "b", "w": 4},
               {"BM": 32, "mode": "a", "w": 4}]
    space = Space(configs)
    assert space.values == {"BM": [16, 32, 64], "mode": ["a", "b"]}  # w never varies: no feature
    r = 1 / np.sqrt(2)
    assert np.allclose(space.features, [[0, r, 0], [1, 0, r], [0.5, r, 0]])  # log2 scaled; one-hot
    given = Space(configs, [canonical_json(c) for c in configs])
    assert given.keys == space.keys and np.array_equal(given.features, space.features)
    with pytest.raises(ValueError, match="2 keys for 3 candidates"):
        Space(configs, space.keys[:2])
    mixed = Space([{"BM": 16}, {"BM": 32, "extra": 1}, {"BM": 32, "extra": 2}])  # key sets differ
    assert mixed.values == {"BM": [16, 32], "extra": [None, 1, 2]}


def test_final_remeasurement_is_interleaved_and_within_budget(points):
    p = points[1]
    s = get_strategy("model")
    s.start(SearchContext(None, p.problem, p.configs, [], budget=80, seed=0))
    times = {}
    while batch := s.propose(8):
        obs = [Observation(c, "ok", 1.0 + 0.001 * len(times) + 0.0001 * i, 0.01) for i, c in enumerate(batch)]
        times.update({o.key: o.time_ms for o in obs})
        s.observe(obs)
    again = s.remeasure()
    assert again and len(times) + len(again) <= 80
    top = sorted(times, key=times.get)[:3]
    keys = [canonical_json(c) for c in again]
    assert keys[:3] == top and keys[3:6] == top  # A B C A B C
    # the first-looking config measures slow twice: the runner-up wins on its mean
    s.observe_remeasured([Observation(c, "ok", 2.0 if k == top[0] else times[k], 0.01)
                          for c, k in zip(again, keys, strict=True)])
    assert s.winner().key == top[1]


def test_the_first_warm_start_is_measured_again_even_when_it_reads_slow(points):
    """Measured first, while the compile workers still build the point's inputs on the same GPU, the
    heuristic can read slow; it gets a second reading in the final re-measurement, within budget."""
    p = points[1]
    hint = p.configs[7]
    s = get_strategy("model")
    s.start(SearchContext(None, p.problem, p.configs, [], hints=[hint], budget=80, seed=0))
    seen = []
    while batch := s.propose(8):
        seen += batch
        s.observe([Observation(c, "ok", 9.0 if c == hint else 1.0 + 0.001 * len(seen) + 0.0001 * i, 0.01)
                   for i, c in enumerate(batch)])
    assert seen[0] == hint
    again = s.remeasure()
    assert again[0] == hint and hint not in again[1:] and len(seen) + len(again) <= 80


def test_a_re_checked_warm_start_does_not_win_by_being_the_only_re_measured_config(points):
    """At small budgets the final re-measurement is the warm start alone; the winner is still the
    config with the best mean over its readings, not the only config measured twice."""
    p = points[1]
    hint = p.configs[7]
    s = get_strategy("model")
    s.start(SearchContext(None, p.problem, p.configs, [], hints=[hint], budget=12, seed=0))
    seen = []
    while batch := s.propose(4):
        seen += batch
        s.observe([Observation(c, "ok", 5.0 if c == hint else 1.0 + 0.01 * len(seen) + 0.001 * i, 0.01)
                   for i, c in enumerate(batch)])
    again = s.remeasure()
    assert again == [hint]
    s.observe_remeasured([Observation(hint, "ok", 4.0, 0.01)])
    assert s.winner().key == canonical_json(seen[1]) and s.winner().time_ms < 2.0


def test_default_budget_is_a_tenth(points):
    p = points[1]
    s = get_strategy("model")
    s.start(SearchContext(None, p.problem, p.configs))
    n = 0
    while batch := s.propose(64):
        n += len(batch)
        s.observe([Observation(c, "ok", 1.0, 0.01) for c in batch])
    assert n + len(s.remeasure()) <= max(30, math.ceil(0.1 * len(p.configs)))


def test_default_finds_a_planted_optimum(tmp_path):
    # the bowl's floor, away from where the density alone would put it, 5% below its neighbours
    best = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "num_warps": 8, "num_stages": 2,
            "MODE": "b"}
    assert set(best) == set(SPACE)
    path = tmp_path / "planted.csv"
    write_dataset(path, points=((16, 8),), seed=11, best=best)
    (p,) = load_points(path)
    assert p.configs[int(np.nanargmin(p.time_ms))] == best
    from moetune.tuner.strategies import DEFAULT_STRATEGY

    name = DEFAULT_STRATEGY if DEFAULT_STRATEGY in ADAPTIVE else "model"
    runs = replay([p], [name], ["10%"], seeds=10)
    assert (runs["winner"] == canonical_json(best)).mean() >= 0.8
    assert runs["measurements"].max() <= math.ceil(0.1 * len(p.configs))


def test_beats_random_on_the_stored_landscape(points):
    runs = replay(points, ["model", "coordinate", "random"], ["10%"], seeds=6)
    q = runs.groupby("strategy")["quality"].apply(lambda x: float(np.exp(np.log(x).mean())))
    assert q["model"] < q["random"] and q["coordinate"] < q["random"]
    assert json.loads(runs["winner"].iloc[0]) in points[0].configs


def test_model_measures_hints_first_and_learns_from_failures(points):
    p = points[1]
    hints = [p.configs[7], p.configs[300]]
    s = get_strategy("model")
    s.start(SearchContext(None, p.problem, p.configs, [], hints=hints, budget=60, seed=2))
    assert s.propose(8) == hints  # warm start: neighbouring densities' winners come first
    s.observe([Observation(hints[0], "ok", 1.0, 0.01), Observation(hints[1], "compile_error")])
    idx, y = s._data()
    assert y[idx.index(p.index[canonical_json(hints[1])])] == y.max()  # a failure counts as slow


@pytest.mark.parametrize("name", ADAPTIVE)
def test_upcoming_guesses_fresh_candidates_and_often_the_next_batch(points, name):
    p = points[1]
    times = dict(zip(map(canonical_json, p.configs), p.time_ms, strict=True))
    s = get_strategy(name)
    s.start(SearchContext(None, p.problem, p.configs, [], budget=60, seed=3))
    allowed, seen, hits, guessed = {canonical_json(c) for c in p.configs}, set(), 0, 0
    while True:
        guess = [canonical_json(c) for c in s.upcoming(8)]
        assert set(guess) <= allowed and not set(guess) & seen and len(set(guess)) == len(guess)
        assert [canonical_json(c) for c in s.upcoming(8)] == guess  # a guess proposes nothing
        batch = s.propose(4)
        if not batch:
            break
        keys = [canonical_json(c) for c in batch]
        hits, guessed = hits + len(set(keys) & set(guess)), guessed + len(keys)
        seen.update(keys)
        s.observe([Observation(c, "ok", times[k], 0.01) for c, k in zip(batch, keys, strict=True)])
    assert s.upcoming(8) == []  # budget spent: nothing more to compile
    assert hits >= guessed // 4  # the guesses are worth compiling ahead
