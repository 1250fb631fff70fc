"""The worker's input pool: weights made once per (kernel, shape), everything else fresh per candidate."""

import os
import time

import pytest
import torch

from moetune.device import device_info
from moetune.models import get_model
from moetune.specs.base import Inputs, KernelSpec
from moetune.specs.registry import get_spec
from moetune.tuner import worker


def _candidate(kernel, problem):
    task = {"kernel": kernel, "spec_module": "", "problem": problem, "config": {}, "seed": 0}
    return worker._Candidate(task, device_info())


def test_fp8_weights_made_once_and_reused_across_densities(monkeypatch):
    monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())
    spec = get_spec("fp8_decode.gate_up")
    calls = []
    real = spec.make_weights
    monkeypatch.setattr(spec, "make_weights", lambda *a: calls.append(a[2]) or real(*a))
    shape = spec.shape_from_model(get_model("tiny"))
    one, four = spec.problem(shape, 1), spec.problem(shape, 4)
    a = worker.make_inputs(_candidate(spec.name, one), seed=1)
    b = worker.make_inputs(_candidate(spec.name, one), seed=2)
    c = worker.make_inputs(_candidate(spec.name, four), seed=3)
    assert len(calls) == 1  # one weight set for the shape, whatever the density
    assert a.tensors["w"] is b.tensors["w"] is c.tensors["w"]
    assert not torch.equal(a.tensors["a"], b.tensors["a"])  # fresh activations per candidate
    assert c.tensors["a"].shape[0] == 4 and c.outputs[0].shape[0] == 4 * shape["top_k"]
    rotated = worker.make_inputs(_candidate(spec.name, one), seed=4, weight_set=1)
    assert len(calls) == 2 and calls[0] != calls[1]  # another seeded weight set for L2 rotation
    assert not torch.equal(rotated.tensors["w"].float(), a.tensors["w"].float())


def test_fp4_inputs_with_pooled_weights_match_the_reference():
    spec = get_spec("fp4_prefill.gate_up")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 4)
    weights = spec.make_weights(problem, "cpu", 7)
    x = spec.make_inputs(problem, "cpu", 1, weights=weights)
    y = spec.make_inputs(problem, "cpu", 2, weights=weights)
    assert x.tensors["w"] is weights["w"] and not torch.equal(x.tensors["a"].float(), y.tensors["a"].float())
    alone = spec.make_inputs(problem, "cpu", 1)  # no pool: a complete input set as before
    assert alone.tensors["w"].shape == weights["w"].shape


class _InputsOnly(KernelSpec):
    """A plugin spec from before make_weights: make_inputs without a ``weights`` argument."""

    name = "test.inputs_only"

    def make_inputs(self, problem, device, seed):
        return Inputs({"x": torch.full((2,), float(seed))}, (torch.empty(2),))


def test_a_spec_without_make_weights_gets_fresh_inputs(monkeypatch):
    monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())
    monkeypatch.setattr(worker._Candidate, "__init__", lambda self, task, device: None)
    cand = worker._Candidate({}, None)
    cand.spec, cand.where, cand.device, cand.task = _InputsOnly(), "cpu", device_info(), {}
    cand.problem = _InputsOnly().problem({"E": 2, "N": 2, "K": 2, "top_k": 1}, 1)
    assert worker.make_inputs(cand, 3).tensors["x"][0] == 3.0
    assert worker.make_inputs(cand, 5).tensors["x"][0] == 5.0


def test_a_measurement_reports_its_phases():
    import crashy_spec  # noqa: F401  (registers test.crashy)

    spec = get_spec("test.crashy")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 2)
    task = {"mode": "measure", "kernel": spec.name, "spec_module": "crashy_spec", "problem": problem,
            "config": {"mode": "ok", "v": 0}, "seed": 3, "timing": {}}
    res = worker.handle(task, device_info())
    assert res["status"] == "ok", res.get("reason")
    assert set(res["phases_ms"]) == {"setup", "inputs_host", "inputs_sync", "timing_sets", "reference",
                                     "check", "timing"}
    assert all(v >= 0 for v in res["phases_ms"].values())
    assert sum(res["phases_ms"].values()) <= res["wall_ms"] + 1e-6
    bad = worker.handle({**task, "config": {"mode": "wrong", "v": 0}}, device_info())
    assert bad["status"] == "inaccurate" and "timing" not in bad["phases_ms"]  # checked, never timed


def test_compile_stand_in_weights_are_made_once_under_the_shared_lock(monkeypatch, tmp_path):
    """Compile workers draw a fewer-experts stand-in's weights one at a time and once per shape, as
    measurements do their pooled weights: thirty workers each holding their own generation peak ran an
    H200 out of memory (DeepSeek-V3 TP1)."""
    import fcntl

    lock = tmp_path / "inputs.lock"
    spec = get_spec("fp8_decode.gate_up")
    shape = {**spec.shape_from_model(get_model("tiny")), "E": 40}
    one, two = spec.problem(shape, 1), spec.problem(shape, 2)
    assert spec.compile_problem(one) != one  # the stand-in branch
    held = []
    real = spec.make_weights

    def probe(*args, **kwargs):
        with open(lock, "a") as other:  # another open file: blocked while the lock is held
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
            else:
                fcntl.flock(other, fcntl.LOCK_UN)
                held.append(False)
        return real(*args, **kwargs)

    monkeypatch.setattr(spec, "make_weights", probe)
    monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())
    pool = worker._CompileInputs()
    a = pool.get(_candidate(spec.name, one), 0, str(lock))
    assert held == [True]
    assert a.tensors["w"].shape[0] == spec.compile_problem(one).shape["E"]
    assert pool.get(_candidate(spec.name, one), 0, str(lock)) is a  # the same problem: the same inputs
    b = pool.get(_candidate(spec.name, two), 0, str(lock))
    assert b is not a and b.tensors["w"] is a.tensors["w"] and held == [True]  # one weight set per shape
    assert worker._WEIGHTS.key is None  # the measurements' pool holds no stand-in


def test_a_far_slower_probe_is_the_reading_and_nothing_is_captured(monkeypatch):
    """On a GPU, a capturable op's candidate is timed once (behind a spin kernel) before any CUDA graph;
    over slow_ratio x the point's best, that run is its reading. Within it, graph timing goes on.
    (Simulated here: CPU tensors on a device that says GPU, the CUDA calls stubbed.)"""
    import dataclasses

    import crashy_spec  # noqa: F401  (registers test.crashy)

    from moetune.tuner import timing

    spec = get_spec("test.crashy")
    monkeypatch.setattr(spec, "cuda_graph", True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    probes, graphs = [], []
    monkeypatch.setattr(timing, "time_probe", lambda fn, opts: fn() or probes.append(1) or 0.5)
    monkeypatch.setattr(timing, "time_graph", lambda *a: graphs.append(1) or ([0.1] * 10, 1))
    gpu = dataclasses.replace(device_info(), name="NVIDIA H200", arch="sm_90", is_gpu=True, l2_bytes=0)
    init = worker._Candidate.__init__

    def on_cpu(self, task, device):
        init(self, task, device)
        self.where = "cpu"

    monkeypatch.setattr(worker._Candidate, "__init__", on_cpu)
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 2)
    task = {"mode": "measure", "kernel": spec.name, "spec_module": "crashy_spec", "problem": problem,
            "config": {"mode": "ok", "v": 0}, "seed": 3, "timing": {}, "best_ms": 0.2}
    res = worker.handle(task, gpu)
    assert res["status"] == "ok" and res["time_ms"] == 0.5 and res["n_runs"] == 1
    assert "far slower" in res["reason"] and "2.5x" in res["reason"] and not graphs
    res = worker.handle({**task, "best_ms": 0.4}, gpu)  # 1.25x: a contender, graph-timed
    assert res["time_ms"] == pytest.approx(0.1) and res["n_runs"] == 10 and graphs == [1]
    res = worker.handle({**task, "best_ms": None}, gpu)  # no best yet: no probe
    assert len(probes) == 2 and graphs == [1, 1]
    res = worker.handle({**task, "timing": {"probe": False}}, gpu)  # turned off
    assert len(probes) == 2 and graphs == [1, 1, 1]
    bad = worker.handle({**task, "config": {"mode": "wrong", "v": 0}}, gpu)
    assert bad["status"] == "inaccurate" and len(probes) == 2  # checked first, never probed


def test_a_compile_task_reports_its_cpu_time_beside_its_wall_time(monkeypatch):
    """A compile whose CPU time is far below its wall time waited on something else (the GPU, a lock):
    the sweep's summary reports the ratio so such a wait shows."""
    spec = get_spec("fp8_decode.gate_up")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 1)
    monkeypatch.setattr(worker, "_COMPILE_INPUTS", worker._CompileInputs())
    monkeypatch.setattr(worker, "_yield_cpu", lambda: None)
    burn = 0.2

    def busy_run(inputs, config):  # the compile, as CPU work
        t = time.process_time()
        while time.process_time() - t < burn:
            pass

    monkeypatch.setattr(spec, "run", busy_run)
    task = {"mode": "compile", "kernel": spec.name, "spec_module": "", "problem": problem, "config": {},
            "seed": 0}
    res = worker.handle(task, device_info())
    assert res["status"] == "ok"
    # process time counts every thread (torch's too): above the wall time under load, by a little. os.times
    # counts clock ticks (10 ms on Linux), user and system apart: a reading may fall two ticks short
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK")
    assert burn * 1e3 - 2 * tick_ms - 1 <= res["cpu_ms"] <= res["wall_ms"] * 1.5 + 20
    monkeypatch.setattr(spec, "run", lambda inputs, config: time.sleep(burn))  # waiting, not computing
    res = worker.handle(task, device_info())
    assert res["wall_ms"] >= burn * 1e3 and res["cpu_ms"] < 0.5 * res["wall_ms"]
    assert "cpu_ms" not in worker.handle({**task, "mode": "measure"}, device_info())


def test_kernel_only_timing_marks_the_inputs(monkeypatch):
    """TimingOptions.kernel_only reaches the spec through the inputs the worker makes (every set)."""
    monkeypatch.setattr(worker, "_WEIGHTS", worker._WeightPool())
    spec = get_spec("fp8_decode.down")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), 2)
    cand = _candidate(spec.name, problem)
    assert "kernel_only" not in worker.make_inputs(cand, seed=1).extra
    cand.task["timing"] = {"kernel_only": True}
    assert worker.make_inputs(cand, seed=1).extra["kernel_only"] is True
    assert worker.make_inputs(cand, seed=2, weight_set=1).extra["kernel_only"] is True
