"""Ray actors as workers, on a local cluster that declares 4 CPUs and one (fake) GPU shared by two actors."""

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'moetune[ray]'")

import crashy_spec  # noqa: E402  (registers test.crashy and test.steady)

from moetune.models import get_model  # noqa: E402
from moetune.problem import canonical_json  # noqa: E402
from moetune.tuner.backends.base import WorkerState  # noqa: E402
from moetune.tuner.backends.ray import RayBackend  # noqa: E402
from moetune.tuner.parallel import ParallelSweep  # noqa: E402
from moetune.tuner.store import Store  # noqa: E402

TESTS = Path(__file__).parent.parent  # crashy_spec lives there
# With --dist loadgroup (the README's test command), one worker runs these in a row: one local cluster
# per test run, never two at once, never restarted.
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def cluster():
    """Actors inherit this environment: the test specs' folder on the path, slow candidates, interpreter."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "CRASHY_SLEEP")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), saved["PYTHONPATH"]]))
    os.environ["CRASHY_SLEEP"] = "0.1"
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _problems(spec, tokens):
    return [spec.problem(spec.shape_from_model(get_model("tiny")), t) for t in tokens]


EXPECTED = {"ok": "ok", "wrong": "inaccurate", "raise": "crash", "refuse": "invalid",
            "compile": "compile_error", "abort": "crash"}


def test_two_actors_sharing_a_gpu_measure_every_candidate_once_despite_crashes_and_a_killed_actor(
        tmp_path, cluster):
    # All-good candidates at one point; at another, the first 8 of the crashing spec in space order
    # (3 ok, then wrong, raise, refuse, compile, abort: a candidate that kills its worker process).
    problems = _problems(crashy_spec.STEADY, [1]) + _problems(crashy_spec.SPEC, [2])
    backend = RayBackend(gpus_per_actor=0.5, timeout=60)  # the cluster's one GPU, two actors on it
    # each actor gets half the CPUs: 2 compile processes, batches of 2 candidates
    killed = []

    def on_event(kind, **data):
        if kind == "result" and not killed:
            other = 1 - int(data["worker"].removeprefix("actor"))  # still busy with a candidate
            ray.kill(backend.actors[other])
            killed.append(other)

    with Store(tmp_path / "ray.sqlite") as store, backend:
        assert [st.where.split(" gpu ")[1].split()[0] for st in backend.states.values()] == ["0", "0"]
        sweep = ParallelSweep(store, backend, strategy="exhaustive", budget=8, on_event=on_event)
        points = sweep.run(problems)
        rows = store.frame()
    assert backend.jobs == backend.batch == 2
    assert killed and backend.states[f"actor{killed[0]}"].counts["lost"] == 1  # rescheduled, not recorded
    # exactly what a single-worker exhaustive sweep measures: the default, then candidates in order
    want = set()
    for pt in points:
        order = dict.fromkeys(canonical_json(c) for c in [pt.default, *pt.candidates])
        want |= {(pt.problem.tokens, c) for c in list(order)[:8]}
    got = list(zip(rows["tokens"], rows["config"], strict=True))
    assert len(got) == len(set(got)) == len(want) == 14 and set(got) == want
    steady = rows[rows["tokens"] == 1]
    assert (steady["status"] == "ok").all()
    crashy = rows[rows["tokens"] == 2]
    crashy = {json.loads(c)["mode"]: s for c, s in zip(crashy["config"], crashy["status"], strict=True)
              if json.loads(c)["v"] == 0}
    assert crashy == EXPECTED
    abort = rows[rows["config"].str.contains('"abort"')]["reason"].iloc[0]
    assert abort.startswith("while compiling") and "SIGABRT" in abort  # the process died, its actor did not
    assert sum(st.counts["lost"] for st in backend.states.values()) == 1


def test_a_task_that_keeps_losing_actors_is_recorded_as_a_crash_the_rest_requeue_first(cluster):
    backend = RayBackend(timeout=5, max_losses=2)
    backend.ray = type("FakeRay", (), {"kill": staticmethod(lambda actor: None)})
    backend._new_actor = lambda slot: f"actor #{slot} again"
    backend.actors, backend.states = ["actor #0"], {"actor0": WorkerState("actor0")}
    for key in "abc":
        backend._tasks[key] = ({"mode": "measure"}, key)
    backend._queue.extend("c")
    backend._pending[0] = {0: "a", 1: "b"}
    backend.losses["a"] = 1  # "a" lost an actor before
    out = backend._lost(0, "node died")
    assert [(k, r["status"]) for k, r, _ in out] == [("a", "crash")]
    assert "lost 2 Ray actors" in out[0][1]["reason"]
    assert list(backend._queue) == ["b", "c"] and "a" not in backend._tasks  # "b" first, to the next actor
    assert backend.actors == ["actor #0 again"] and backend.states["actor0"].counts["lost"] == 1
    assert 0 not in backend._pending


def test_launch_creates_the_actors_at_once_and_start_waits_for_them(cluster):
    """The CLI launches while it plans: actors exist (and start their workers) before start() is asked."""
    backend = RayBackend(gpus_per_actor=0.5, timeout=60)
    try:
        backend.launch()
        actors = list(backend.actors)
        assert len(actors) == 2 and backend.device is None
        backend.launch()  # a second call changes nothing
        assert backend.actors == actors
        device = backend.start()
        assert device is backend.device and all(st.where for st in backend.states.values())
    finally:
        backend.close()


def test_an_actor_that_stops_answering_is_treated_as_lost(monkeypatch):
    import time

    from moetune.tuner.backends import ray as ray_backend

    class FakeRay:
        exceptions = ray.exceptions
        killed = []

        @staticmethod
        def wait(refs, num_returns=1, timeout=None):
            return [], list(refs)  # nothing ever answers

        @staticmethod
        def kill(actor):
            FakeRay.killed.append(actor)

    class Actor:
        def __init__(self, name):
            self.name = name
            self.add = self.collect = type("Remote", (), {"remote": staticmethod(lambda *a: f"{name} call")})

    backend = RayBackend(timeout=5)
    backend.ray = FakeRay
    backend._new_actor = lambda slot: Actor(f"actor #{slot} again")
    backend.actors, backend.states = [Actor("actor #0")], {"actor0": WorkerState("actor0")}
    backend.submit("a", {"mode": "measure"})
    assert backend._collecting == {"actor #0 call": 0}
    assert backend.poll(0) == [] and FakeRay.killed == []  # slow so far, not stuck
    monkeypatch.setattr(ray_backend, "STARTUP_TIMEOUT_S", -1e9)  # every call is now long overdue
    assert backend.poll(0) == []  # the task goes back to the queue, to the new actor
    assert [a.name for a in FakeRay.killed] == ["actor #0"] and backend.states["actor0"].counts["lost"] == 1
    assert backend.losses["a"] == 1 and backend._collecting == {"actor #0 again call": 0}
    assert time.monotonic() - backend._asked["actor #0 again call"] < 60


def test_an_actor_whose_add_failed_says_so_at_the_next_collect(monkeypatch):
    """Nobody waits on add(): a failure there must not leave its tasks waiting forever."""
    from moetune.tuner.backends.ray import MeasureActor

    actor = MeasureActor("actor0", jobs=1)
    try:
        def broken(*args, **kwargs):
            raise KeyError("boom")

        monkeypatch.setattr(actor.compiler, "add", broken)
        with pytest.raises(KeyError):
            actor.add([(0, {"mode": "measure"})], 5.0)
        with pytest.raises(RuntimeError, match="adding tasks: KeyError"):
            actor.collect(0.0)
    finally:
        actor.close()
