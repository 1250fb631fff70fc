"""Sweeps over several workers: --gpus parsing, the parallel driver, the local per-GPU pool, the CLI."""

import collections
import json
import os
import sys
import zlib

import crashy_spec
import pytest
from typer.testing import CliRunner

from moetune.cli import app
from moetune.device import INTERPRETER
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import get_spec
from moetune.tuner import factory, parallel
from moetune.tuner.backends import local
from moetune.tuner.backends.base import BusyClock
from moetune.tuner.backends.local import LocalBackend, parse_gpus
from moetune.tuner.backends.process import Runner, binary_id
from moetune.tuner.export import export
from moetune.tuner.factory import make_runner
from moetune.tuner.parallel import ParallelSweep
from moetune.tuner.store import Store
from moetune.tuner.strategies import STRATEGIES
from moetune.tuner.sweep import BATCH, REMEASURE, Sweep


# ---- --gpus ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,count,want", [("all", 4, [0, 1, 2, 3]), ("ALL", 1, [0]), ("2,0", 3, [2, 0]),
                                             (" 1 ", 2, [1])])
def test_parse_gpus(text, count, want):
    assert parse_gpus(text, count) == want


@pytest.mark.parametrize("text,count,match", [
    ("all", 0, "no CUDA GPU"), ("2", 2, r"no GPU 2 .*GPUs 0\.\.1"), ("0", 0, r"no GPU 0 .*no GPU visible"),
    ("a", 2, "'a' is not a GPU index"), ("-1", 2, "not a GPU index"), ("0,0", 2, "given twice"),
    ("", 2, "not a GPU index"), ("0,,1", 2, "not a GPU index"),
])
def test_parse_gpus_rejects(text, count, match):
    with pytest.raises(ValueError, match=f"--gpus.*{match}"):
        parse_gpus(text, count)


def test_make_runner_picks_the_backend(monkeypatch):
    monkeypatch.setattr(factory, "gpu_count", lambda: 3)
    runner, driver = make_runner()  # no option on a GPU host: every point at once on GPU 0
    assert isinstance(runner, LocalBackend) and driver is ParallelSweep and runner.devices == [0]
    runner.close()
    monkeypatch.setattr(factory, "gpu_count", lambda: 0)
    runner, driver = make_runner()  # no GPU: the plain sweep through the interpreter
    assert type(runner) is Runner and driver is Sweep
    runner.close()
    runner, _ = make_runner(timing={"slow_ratio": 0.0})  # --full-timing reaches every backend's tasks
    assert runner.timing == {"slow_ratio": 0.0}
    runner.close()
    monkeypatch.setattr(factory, "gpu_count", lambda: 3)
    runner, driver = make_runner(gpus="2")  # one GPU named: every point at once, on that GPU
    assert isinstance(runner, LocalBackend) and driver is ParallelSweep and runner.devices == [2]
    runner.close()
    runner, driver = make_runner(gpus="all", timeout=5, timing={"slow_ratio": 0.0})
    assert isinstance(runner, LocalBackend) and driver is ParallelSweep
    assert runner.timing == {"slow_ratio": 0.0}
    assert runner.workers == ["gpu0", "gpu1", "gpu2"] and runner.devices == [0, 1, 2]
    runner.close()
    with pytest.raises(ValueError, match="--gpus and --ray"):
        make_runner(gpus="all", ray=True)
    with pytest.raises(ValueError, match="need --ray"):
        make_runner(ray_address="auto")


def test_every_backend_implements_the_one_interface():
    from moetune.tuner.backends.base import PoolBackend, SequentialBackend
    from moetune.tuner.backends.ray import RayBackend

    assert issubclass(Runner, SequentialBackend)
    assert issubclass(LocalBackend, PoolBackend) and issubclass(RayBackend, PoolBackend)
    runner = Runner(timeout=1.0, jobs=0)  # what a single-worker backend leaves to the defaults
    assert runner.states == {} and runner.workers == [] and runner.compiling() is None
    assert runner.idle_compilers() == 0 and runner.prefetch({"mode": "measure"}) is None
    runner.close()


def test_ray_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'moetune\[ray\]'"):
        make_runner(ray=True)


# ---- the driver, on a fake backend (no processes) -------------------------------------------------------
class FakeBackend:
    """Workers that answer at once: every candidate ok, time from its config; records what it ran."""

    def __init__(self, n):
        self.workers = [f"w{i}" for i in range(n)]
        self.device, self.versions, self.timeout, self.timing = INTERPRETER, {}, 1.0, {}
        self.queue, self.ran = collections.deque(), []

    def capacity(self):
        return len(self.workers) - len(self.queue)

    def submit(self, key, task, label=""):
        self.queue.append((key, task))

    def poll(self):
        out = []
        while self.queue:
            key, task = self.queue.popleft()
            cfg = task["config"]
            self.ran.append((task["problem"].tokens, canonical_json(cfg)))
            t = 1.0 + (zlib.crc32(canonical_json(cfg).encode()) % 97) / 10  # not hash(): the same every run
            worker = self.workers[len(out) % len(self.workers)]
            out.append((key, {"status": "ok", "time_ms": t, "n_runs": 1, "wall_ms": 1.0}, worker))
            if len(out) == 2:  # results arrive a few at a time
                break
        return out


def _problems(kernel, tokens):
    spec = get_spec(kernel)
    return [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in tokens]


def test_driver_measures_every_candidate_once_across_points(tmp_path):
    problems = _problems("test.steady", [1, 2, 4])
    backend = FakeBackend(4)
    with Store(tmp_path / "r.sqlite") as store:
        points = ParallelSweep(store, backend, strategy="exhaustive").run(problems)
        rows = store.frame()
        assert store._conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0  # all released
    keys = list(zip(rows["tokens"], rows["config"], strict=True))
    assert len(keys) == len(set(keys)) == 18 and sorted(keys) == sorted(backend.ran)
    default = canonical_json(crashy_spec.STEADY.default)
    for t in (1, 2, 4):  # the default is each point's first row, the baseline
        assert rows[rows["tokens"] == t].iloc[0]["config"] == default
    assert all(pt.baseline is not None and sum(pt.counts.values()) == 6 for pt in points)


def test_driver_tells_each_candidate_the_points_best_so_far(tmp_path):
    """The worker times a candidate far slower than the best briefly: it must be told the best."""
    backend = FakeBackend(3)
    sent = []
    submit = backend.submit
    backend.submit = lambda key, task, label="": (sent.append(task), submit(key, task, label))
    with Store(tmp_path / "r.sqlite") as store:
        sweep = ParallelSweep(store, backend, strategy="model", budget=40, seed=2)
        sweep.run(_problems("test.steady_wide", [1]))
        rows = store.frame()
    times = list(rows.loc[rows["strategy"] != "remeasure", "time_ms"])  # the fake answers in send order
    searched = sent[:len(times)]
    assert searched[0]["best_ms"] is None  # the baseline: nothing measured yet
    bests = [t["best_ms"] for t in searched[1:]]
    for i, best in enumerate(bests, start=1):  # the best of what had come back when it was sent
        assert best in {min(times[:j]) for j in range(1, i + 1)}
    assert bests == sorted(bests, reverse=True)
    assert bests[-1] <= min(times[:len(times) // 2])  # not stuck at a stale value
    finals = sent[len(times):]
    assert finals and all(t["best_ms"] is None for t in finals)  # finalists: re-measured in full


def test_busy_clock_tells_a_compile_bound_sweep_from_a_gpu_bound_one():
    fed = BusyClock()  # one worker, back-to-back 0.5 s tasks
    for end in (10.0, 10.5, 11.0):
        fed.add(end, 0.5)
    assert fed.fraction(1) == pytest.approx(1.0)
    starved = BusyClock()  # the same tasks, 2 s apart: 1.5 s of work in 4.5 s
    for end in (10.0, 12.0, 14.0):
        starved.add(end, 0.5)
    assert starved.fraction(1) == pytest.approx(1 / 3)
    assert starved.fraction(2) == pytest.approx(1 / 6)  # two workers sharing that work
    assert BusyClock().fraction(1) is None


def test_driver_reports_how_busy_its_measuring_workers_were(tmp_path):
    backend = FakeBackend(2)
    with Store(tmp_path / "r.sqlite") as store:
        sweep = ParallelSweep(store, backend, strategy="exhaustive")
        sweep.run(_problems("test.steady", [1]))
    assert sweep.busy.busy_s == pytest.approx(6 * 1e-3)  # 6 results of 1 ms each
    assert sweep.measuring_busy is not None and sweep.measuring_busy > 0


@pytest.mark.parametrize("workers", [1, 3])
def test_adaptive_strategies_get_the_same_batches_whatever_the_worker_count(tmp_path, monkeypatch, workers):
    sizes = []

    class Recording(STRATEGIES["coordinate"]):
        def propose(self, n):
            batch = super().propose(n)
            sizes.append((n, len(batch)))
            return batch

        def observe(self, results):
            assert len(results) == 1
            super().observe(results)

    monkeypatch.setattr(parallel, "get_strategy", lambda name: Recording())
    problems = _problems("fp8_decode.gate_up", [1, 16])
    with Store(tmp_path / "r.sqlite") as store:
        ParallelSweep(store, FakeBackend(workers), strategy="coordinate", budget=12).run(problems)
        rows = store.frame()
    searched = rows[rows["strategy"] != REMEASURE]  # the warm start's recheck is a repeat
    assert sizes and {n for n, _ in sizes} == {BATCH}  # as the plain sweep asks, with 1 worker or 3
    assert sum(k for _, k in sizes) == len(searched) - 2  # everything proposed was measured, defaults aside
    for t in (1, 16):
        assert searched[searched["tokens"] == t]["config"].is_unique and (rows["tokens"] == t).sum() <= 12


@pytest.mark.parametrize("budget", [60, 320])  # 320: the polish reaches a tile's other splits
def test_a_batch_goes_to_the_compilers_first_pick_then_slowest_compile_first_each_binary_once(
        tmp_path, monkeypatch, budget):
    spec = get_spec("fp8_decode.gate_up")
    batches = []

    class Recording(STRATEGIES["model"]):
        def propose(self, n):
            batches.append(super().propose(n))
            return batches[-1]

    monkeypatch.setattr(parallel, "get_strategy", lambda name: Recording())
    backend = FakeBackend(2)
    with Store(tmp_path / "r.sqlite") as store:
        ParallelSweep(store, backend, strategy="model", budget=budget).run(
            _problems("fp8_decode.gate_up", [16]))
    ran = [cfg for _, cfg in backend.ran[1:]]  # in the order submitted; the default first, alone
    at = 0
    repeats = 0
    for batch in filter(None, batches):
        keys = [canonical_json(c) for c in batch]
        slowest = sorted(keys[1:], key=lambda k: -spec.compile_cost(json.loads(k)))
        # a config whose binary (its tile without SPLIT_K) comes earlier in the batch waits behind the rest
        seen, first, again = {_no_split(keys[0])}, [], []
        for k in slowest:
            (again if _no_split(k) in seen else first).append(k)
            seen.add(_no_split(k))
        repeats += len(again)
        assert ran[at:at + len(keys)] == keys[:1] + first + again
        at += len(keys)
    assert at > 20 and any(len(b) > 5 for b in batches)
    assert repeats > 0 or budget < 100  # the polish's batches hold a tile's other splits
    wide = {**spec.default, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "num_stages": 4, "num_warps": 4}
    assert spec.compile_cost(wide) > spec.compile_cost({**wide, "num_warps": 8}) > \
        spec.compile_cost({**wide, "BLOCK_SIZE_K": 128, "num_warps": 8})


def _no_split(key):
    return json.dumps({k: v for k, v in json.loads(key).items() if k != "SPLIT_K"}, sort_keys=True)


def test_compile_order_builds_each_binary_once_before_the_configs_that_reuse_it():
    spec = get_spec("fp8_decode.gate_up")
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
    a1, a4 = {**tile, "BLOCK_SIZE_N": 128}, {**tile, "BLOCK_SIZE_N": 128, "SPLIT_K": 4}
    b1, c1, c2 = {**tile, "BLOCK_SIZE_N": 256}, {**tile, "BLOCK_SIZE_N": 64}, {**tile, "BLOCK_SIZE_N": 64,
                                                                                "SPLIT_K": 2}
    assert spec.binary_key(a1) == spec.binary_key(a4) != spec.binary_key(b1)
    assert parallel.compile_order(spec, [a4, c1, a1, b1]) in ([b1, a4, c1, a1], [b1, a1, c1, a4])
    assert parallel.compile_order(spec, [a4, c1, a1, b1], first=[c2])[:2] in ([b1, a4], [b1, a1])
    assert parallel.compile_order(spec, [a4, c1, a1, b1], first=[c2])[-1] == c1  # its binary: queued first
    steady = get_spec("test.steady")  # the default key is the whole config: plain longest-first
    assert steady.binary_key({"mode": "ok", "v": 1}) != steady.binary_key({"mode": "ok", "v": 2})


def test_driver_retries_only_what_failed_that_way(tmp_path):
    problems = _problems("test.steady", [1, 2])
    with Store(tmp_path / "r.sqlite") as store:
        ParallelSweep(store, FakeBackend(2), strategy="exhaustive").run(problems)
        store._conn.execute("UPDATE measurements SET status = 'crash' WHERE id IN (1, 4)")
        store._conn.execute("UPDATE measurements SET status = 'timeout' WHERE id = 5")
        store._conn.commit()
        crashed = set(store.frame().query("status == 'crash'")[["tokens", "config"]].itertuples(index=False))
        backend = FakeBackend(2)
        ParallelSweep(store, backend, strategy="exhaustive", retry=["crash"]).run(problems)
        assert len(store.frame()) == 12 + 2
    assert set(backend.ran) == crashed  # the timeout is not retried, nothing else measured again


def test_driver_hands_idle_compile_workers_fresh_guesses_and_stores_only_measurements(tmp_path):
    class Prefetching(FakeBackend):
        guesses: list = []

        def idle_compilers(self):
            return 3

        def prefetch(self, task):
            self.guesses.append((task["problem"].tokens, canonical_json(task["config"])))

    backend = Prefetching(2)
    problems = _problems("test.steady_wide", [1, 2])
    with Store(tmp_path / "r.sqlite") as store:
        ParallelSweep(store, backend, strategy="coordinate", budget=20, seed=1, prefetch=True).run(problems)
        rows = store.frame()
    assert backend.guesses and len(set(backend.guesses)) == len(backend.guesses)  # each guess once
    assert len(rows) == len(backend.ran)  # guesses were compiled, never measured or stored
    measured = set(zip(rows["tokens"], rows["config"], strict=True))
    assert len(measured & set(backend.guesses)) >= len(backend.guesses) // 4  # and often right


def test_driver_runs_the_final_remeasurement_once(tmp_path):
    problems = _problems("test.steady_wide", [1, 2])
    with Store(tmp_path / "r.sqlite") as store:
        ParallelSweep(store, FakeBackend(3), strategy="model", budget=40, seed=2).run(problems)
        rows = store.frame()
        ParallelSweep(store, FakeBackend(3), strategy="model", budget=40, seed=2).run(problems)
        assert len(store.frame()) == len(rows)  # resume: no second search, no second re-measurement
    for t in (1, 2):
        here = rows[rows["tokens"] == t]
        finals, searched = here[here["strategy"] == "remeasure"], here[here["strategy"] != "remeasure"]
        assert searched["config"].is_unique and len(searched) <= 40
        assert len(finals) >= 2 and set(finals["config"]) <= set(searched["config"])
        assert searched.loc[searched["time_ms"].idxmin(), "config"] in set(finals["config"])


# ---- the local pool: fake GPU indices on interpreter workers ---------------------------------------------
def _sweep(db, runner, driver, problems, strategy="exhaustive", **kw):
    with Store(db) as store, runner:
        driver(store, runner, strategy=strategy, **kw).run(problems)
        return store.frame()


class FakeHandle:
    """A worker that runs whatever it is given until the test says it is done."""

    alive = ready = True

    def __init__(self, name, device):
        self.name, self.device_index, self.task_key, self.binary = name, device, None, None

    @property
    def busy(self):
        return self.task_key is not None

    def submit(self, key, task, timeout):
        self.task_key, self.binary = key, binary_id(task)


def test_pool_compiles_ahead_while_the_gpus_measure(tmp_path):
    backend = LocalBackend([0, 1], jobs=0, log_dir=tmp_path)
    g0, g1, c0, c1 = FakeHandle("gpu0", 0), FakeHandle("gpu1", 1), FakeHandle("c0", 0), FakeHandle("c1", 1)
    backend.measurers, backend.compilers = [g0, g1], [c0, c1]
    for k in "abcde":
        backend.submit(k, {"mode": "measure"})
    assert (c0.task_key, c1.task_key, g0.task_key, g1.task_key) == ("a", "b", None, None)

    def compiled(h):  # what poll() does with a compile worker's ok result
        backend._measure_q.append(h.task_key)
        h.task_key = None
        backend._dispatch()

    compiled(c0)  # "a" goes to a free GPU and its compile worker takes "c" at once
    assert (g0.task_key, c0.task_key, c1.task_key, g1.task_key) == ("a", "c", "b", None)
    compiled(c1)
    assert (g1.task_key, c1.task_key) == ("b", "d")
    compiled(c0)  # both GPUs busy: "c" waits compiled, "e" compiles meanwhile
    assert (list(backend._measure_q), c0.task_key) == (["c"], "e")
    g1.task_key = None  # GPU 1 done: the compiled candidate goes first
    backend._dispatch()
    assert (g0.task_key, g1.task_key, list(backend._measure_q)) == ("a", "c", [])


def test_pool_takes_work_while_a_compile_worker_has_no_binary_to_build(tmp_path, monkeypatch):
    """Compiles run ahead of the GPU: a free compile worker means room for another task, whatever
    waits compiled; a tile's split-K variants (one binary) count once; a full backlog stops intake."""
    spec = get_spec("fp8_decode.gate_up")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 4)
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    g0, c0, c1 = FakeHandle("gpu0", 0), FakeHandle("c0", 0), FakeHandle("c1", 0)
    backend.measurers, backend.compilers = [g0], [c0, c1]

    def task(bn, split):
        return {"mode": "measure", "kernel": spec.name, "problem": problem,
                "config": {"BLOCK_SIZE_N": bn, "SPLIT_K": split}}

    assert backend.capacity() == 2
    backend.submit("a", task(32, 1))
    assert c0.task_key == "a" and backend.capacity() == 1
    backend.submit("b", task(32, 2))  # the same binary as "a": waits for it, takes no compile slot
    assert c1.task_key is None and backend.capacity() == 1
    backend.submit("c", task(64, 1))
    assert c1.task_key == "c" and backend.capacity() == 0
    backend._measure_q.extend(f"done{i}" for i in range(10))  # compiled, waiting for the GPU
    c0.task_key = c1.task_key = None  # both compiles done: room again, though ten wait compiled
    assert backend.capacity() == 1  # "b" still to compile
    monkeypatch.setattr(local, "BACKLOG", 10)
    assert backend.capacity() == 0  # enough compiled work queued for the GPU (no measurement timed yet)
    backend._measure_times.extend([0.007] * 5)  # 7 ms candidates: ten are 0.07 s of GPU work
    assert backend.capacity() == 1
    backend._measure_q.extend(f"more{i}" for i in range(3000))  # 21 s of it: over BACKLOG_S
    assert backend.capacity() == 0


def test_pool_compiles_guesses_only_on_idle_compile_workers(tmp_path):
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    g0, c0, c1 = FakeHandle("gpu0", 0), FakeHandle("c0", 0), FakeHandle("c1", 0)
    backend.measurers, backend.compilers = [g0], [c0, c1]
    assert backend.idle_compilers() == 2
    backend.prefetch({"mode": "measure", "guess": 1})
    backend.prefetch({"mode": "measure", "guess": 2})
    backend.prefetch({"mode": "measure", "guess": 3})
    assert c0.task_key[0] == c1.task_key[0] == "prefetch" and backend.idle_compilers() == -1
    backend.submit("a", {"mode": "measure"})  # asked for: before the waiting guess
    c0.task_key = None
    backend._prefetching.pop()
    backend._dispatch()
    assert c0.task_key == "a" and len(backend._prefetch_q) == 1 and g0.task_key is None
    assert "a" in backend._tasks and not any(k[0] == "prefetch" for k in backend._tasks)


def test_pool_uses_compile_workers_as_they_come_up_without_waiting_for_all(tmp_path):
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    g0, c0, c1 = FakeHandle("gpu0", 0), FakeHandle("c0", 0), FakeHandle("c1", 0)
    c0.ready = False  # still importing torch
    backend.measurers, backend.compilers = [g0], [c0, c1]
    backend.submit("a", {"mode": "measure"})
    backend.submit("b", {"mode": "measure"})
    assert (c0.task_key, c1.task_key, list(backend._compile_q)) == (None, "a", ["b"])
    c0.ready = True
    backend._dispatch()
    assert c0.task_key == "b"


def test_pool_compile_workers_stay_on_one_problem(tmp_path):
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    c0 = FakeHandle("c0", 0)
    backend.measurers, backend.compilers = [FakeHandle("gpu0", 0)], [c0]
    p1, p2 = _problems("test.steady", [1, 2])
    for key, problem in [("a", p1), ("b", p2), ("c", p1), ("d", p2)]:
        backend.submit(key, {"kernel": "test.steady", "problem": problem, "mode": "measure"})
    order = [c0.task_key]
    for _ in range(3):
        c0.task_key = None  # compiled; the measurer is held back, as if busy elsewhere
        backend._measure_q.clear()
        backend._dispatch()
        order.append(c0.task_key)
    assert order == ["a", "c", "b", "d"]  # its problem's tasks first, then the oldest


def test_worker_pool_never_builds_one_binary_on_two_workers_at_once(tmp_path):
    """The pools of the plain runner and of a Ray actor wait the same way."""
    from moetune.tuner.backends.process import WorkerPool

    spec = get_spec("fp8_decode.gate_up")
    (problem,) = _problems("fp8_decode.gate_up", [4])
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
    tasks = [(k, {"kernel": spec.name, "problem": problem, "config": c, "mode": "compile"})
             for k, c in [("a", tile), ("b", {**tile, "SPLIT_K": 2}), ("c", {**tile, "num_warps": 8})]]
    pool = WorkerPool(2, "compile", None, tmp_path)
    c0, c1 = pool.handles = [FakeHandle("c0", 0), FakeHandle("c1", 0)]
    pool.add(tasks, 5.0)
    pool.pump()
    assert (c0.task_key, c1.task_key, [i[0] for i in pool.queue]) == ("a", "c", ["b"])
    c1.task_key = None
    pool.pump()
    assert c1.task_key is None  # b's binary is still being built on c0
    c0.task_key = None
    pool.pump()
    assert "b" in (c0.task_key, c1.task_key) and not pool.queue


def test_pool_never_builds_one_binary_on_two_workers_at_once(tmp_path):
    spec = get_spec("fp8_decode.gate_up")
    (problem,) = _problems("fp8_decode.gate_up", [4])
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
    configs = {"a": tile, "b": {**tile, "SPLIT_K": 4}, "c": {**tile, "num_warps": 8}}  # a, b: one binary
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    g0, c0, c1 = FakeHandle("gpu0", 0), FakeHandle("c0", 0), FakeHandle("c1", 0)
    backend.measurers, backend.compilers = [g0], [c0, c1]
    g0.task_key = "busy"  # the GPU is measuring something else
    for key, config in configs.items():
        backend.submit(key, {"kernel": spec.name, "problem": problem, "config": config, "mode": "measure"})
    assert (c0.task_key, c1.task_key, list(backend._compile_q)) == ("a", "c", ["b"])  # b waits for a
    c1.task_key = None  # c compiled: b's binary is still being built, so c1 waits too
    backend._dispatch()
    assert c1.task_key is None and list(backend._compile_q) == ["b"]
    c0.task_key = None  # a compiled: b finds it in the cache
    backend._dispatch()
    assert "b" in (c0.task_key, c1.task_key) and not backend._compile_q
    backend.prefetch({"kernel": spec.name, "problem": problem, "config": {**tile, "SPLIT_K": 2}})
    idle = c1 if c0.task_key == "b" else c0
    assert idle.task_key is None and len(backend._prefetch_q) == 1  # a guess of a binary being built waits
    backend.prefetch({"kernel": spec.name, "problem": problem, "config": {**tile, "num_warps": 2}})
    backend.submit("d", {"kernel": spec.name, "problem": problem, "config": {**tile, "SPLIT_K": 8},
                         "mode": "measure"})
    assert idle.task_key[0] == "prefetch" and list(backend._compile_q) == ["d"]  # a new binary beats waiting
    assert len(backend._prefetch_q) == 1



def test_a_compile_worker_stuck_starting_fails_the_sweep_instead_of_hanging(tmp_path, monkeypatch):
    import multiprocessing as mp
    import time

    from moetune.tuner.backends import process
    from moetune.tuner.backends.process import WorkerHandle

    class Stuck:  # a process that never says hello and never dies
        killed = False

        def is_alive(self):
            return not self.killed

        def kill(self):
            self.killed = True

        def join(self, timeout=None):
            pass

    h = WorkerHandle("compile0", 0, tmp_path)
    h.proc, (h.conn, other) = Stuck(), mp.Pipe()
    h.launched_at = time.monotonic()
    backend = LocalBackend([0], jobs=0, log_dir=tmp_path)
    backend.measurers, backend.compilers = [FakeHandle("gpu0", 0)], [h]
    backend.submit("a", {"mode": "measure"})
    assert h.task_key is None and list(backend._compile_q) == ["a"]  # still starting: waits, for now
    monkeypatch.setattr(process, "STARTUP_TIMEOUT_S", 0.0)
    with pytest.raises(RuntimeError, match="compile0 did not start within"):
        backend._dispatch()
    assert h.proc is None  # killed, not left running
    other.close()

EXPECTED = {"ok": "ok", "wrong": "inaccurate", "raise": "crash", "refuse": "invalid",
            "compile": "compile_error", "abort": "crash", "segv": "crash", "hang": "timeout"}


def test_pool_keeps_crash_isolation(tmp_path):
    backend = LocalBackend([0, 1], timeout=3.0, jobs=0)
    rows = _sweep(tmp_path / "r.sqlite", backend, ParallelSweep, _problems("test.crashy", [2]))
    got = {json.loads(c)["mode"]: s for c, s in zip(rows["config"], rows["status"], strict=True)
           if json.loads(c)["v"] == 0}
    assert got == EXPECTED and len(rows) == 10 and rows["config"].is_unique
    assert (rows["status"] == "ok").sum() == 3
    per_worker = [sum(st.counts.values()) for st in backend.states.values()]
    assert sum(per_worker) == 10 and min(per_worker) > 0  # both workers measured


def test_start_configs_go_with_the_default_on_a_pool(tmp_path):
    """--start on several GPUs: each point's first batch is its default and the user's starts in its
    space; the random strategy then spends the rest of the budget."""
    backend = LocalBackend([0, 1], timeout=5.0, jobs=1)
    with Store(tmp_path / "s.sqlite") as store, backend:
        sweep = ParallelSweep(store, backend, strategy="random", budget=4, starts=[{"v": 5}, {"v": 99}])
        sweep.run(_problems("test.steady", [1, 2]))
        rows = store.frame()
    for tokens in (1, 2):
        got = [json.loads(c)["v"] for c in rows[rows["tokens"] == tokens]["config"]]
        assert 5 in got and 0 in got and 99 not in got and len(got) == 4, got


def test_pool_accounts_for_its_compile_workers_time(tmp_path):
    """The summary says how busy the compile workers were and how much of their time was CPU: a
    compile-bound sweep whose compile workers sit idle or wait is a scheduling problem, not the compiler."""
    backend = LocalBackend([0], timeout=5.0, jobs=1)
    with Store(tmp_path / "r.sqlite") as store, backend:
        sweep = ParallelSweep(store, backend, strategy="exhaustive")
        sweep.run(_problems("test.steady", [2]))
        n = len(store.frame())
    got = sweep.compiling()
    assert got["tasks"] == n == 6  # every candidate compiled first, once
    # process time counts every thread of a worker, so on sub-millisecond tasks the share can pass 1
    # (1.28 and 1.52 seen on 2 cores); no process gets more CPU seconds than the machine has cores
    assert 0 < got["busy"] <= 1 and got["wall_s"] > 0 and 0 < got["cpu_share"] <= (os.cpu_count() or 1)


# ---- the command ---------------------------------------------------------------------------------------
def test_cli_gpus_covers_what_a_plain_sweep_does_resumes_and_exports_one_table(tmp_path, monkeypatch):
    monkeypatch.setattr(factory, "gpu_count", lambda: 2)  # two fake GPUs: interpreter workers
    problems = _problems("test.steady", [1, 2])
    plain = _sweep(tmp_path / "plain.sqlite", Runner(timeout=30, jobs=0), Sweep, problems)
    db = tmp_path / "pool.sqlite"
    with Store(db) as s:  # a sweep cut short: three of its measurements are already stored
        for row in plain.drop(columns="id").iloc[[0, 4, 7]].to_dict("records"):
            s.add(row)
        before = s.frame()
    args = ["--tokens", "1,2", "--db", str(db), "--gpus", "all", "--jobs", "1", "--strategy", "exhaustive"]
    res = CliRunner().invoke(app, ["sweep", "--kernel", "test.steady", "--model", "tiny", *args])
    assert res.exit_code == 0, res.output
    assert "workers" in res.output and "gpu0" in res.output and "gpu1" in res.output  # one row per GPU
    with Store(db) as s:
        pool = s.frame()
    key = ["tokens", "config", "status"]
    assert len(pool) == len(plain) == 12 and not pool.duplicated(["tokens", "config"]).any()
    assert sorted(map(tuple, pool[key].values)) == sorted(map(tuple, plain[key].values))
    assert pool[pool["id"].isin(before["id"])].equals(before)  # resumed: nothing redone, nothing lost
    result = export(db, tmp_path / "tables")  # rows of both workers (one device name) make one table
    tables = [f.path for f in result.files if "cpu_interpreter" in str(f.path)]
    assert len(tables) == 1
    doc = json.loads(tables[0].read_text())
    assert sorted(e["tokens"] for e in doc["entries"]) == [1, 2]


@pytest.mark.parametrize("args,match", [(["--gpus", "3"], "no GPU 3"), (["--gpus", "0", "--ray"], "exclude"),
                                        (["--ray-actors", "2"], "need --ray")])
def test_cli_bad_parallel_options(tmp_path, monkeypatch, args, match):
    monkeypatch.setattr(factory, "gpu_count", lambda: 2)
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["sweep", "--kernel", "test.steady", "--model", "tiny", "--tokens", "1",
                                   "--db", str(db), *args])
    assert res.exit_code != 0 and match in res.output and "Traceback" not in res.output
    assert not db.exists()


def test_cli_ray_without_ray_is_one_line_saying_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["sweep", "--kernel", "test.steady", "--model", "tiny", "--tokens", "1",
                                   "--db", str(db), "--ray"])
    assert res.exit_code != 0 and "Traceback" not in res.output and not db.exists()
    assert res.output.strip() == "error: --ray needs Ray, which is not installed: pip install 'moetune[ray]'"


def test_a_ready_only_pump_keeps_the_crash_of_a_worker_that_died_on_its_task(tmp_path):
    """A Ray actor's add() pumps its compile pool (ready_only) whenever tasks arrive: if a worker has just
    died on a task (os.abort), that pump must not restart it before harvest() collects the crash, or
    the task is never answered (the Ray test hung on it under load)."""
    import time

    from moetune.tuner.backends.process import WorkerPool

    spec = crashy_spec.SPEC
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 1)
    task = {"mode": "compile", "kernel": spec.name, "spec_module": type(spec).__module__, "problem": problem,
            "config": {"mode": "abort", "v": 0}, "seed": 0, "timing": {}, "best_ms": None}
    pool = WorkerPool(1, "compile", None, tmp_path)
    h = pool.handles[0]
    try:
        pool.add([("k", task)], 120.0)
        deadline = time.monotonic() + 300
        while not h.busy:  # launched by the first pump, takes the task once it has said hello
            assert time.monotonic() < deadline, "the compile worker never took its task"
            pool.pump(ready_only=True)
            time.sleep(0.05)
        h.proc.join(120)
        assert not h.alive  # it aborted on the task
        pool.pump(ready_only=True)  # what the actor's add() does before its collect() harvests
        (key, res), = pool.harvest()
        assert key == "k" and res["status"] == "crash" and "SIGABRT" in res["reason"]
    finally:
        pool.stop()


def test_cross_on_the_parallel_driver(tmp_path):
    """--cross through ParallelSweep: each point measures the other points' bests; with times that depend
    on the config alone, every point then ends at the fastest of them."""
    problems = _problems("test.steady_wide", [1, 2, 4])
    with Store(tmp_path / "x.sqlite") as store:
        sw = ParallelSweep(store, FakeBackend(3), strategy="random", budget=3, seed=1)
        bests = {canonical_json(pt.best.config) for pt in sw.run(problems)}
        sw.cross()
        rows = store.frame()
    assert len(bests) > 1  # else the pass has nothing to do
    for t in (1, 2, 4):
        assert bests <= set(rows[rows["tokens"] == t]["config"])
    assert len({canonical_json(pt.best.config) for pt in sw.points}) == 1
