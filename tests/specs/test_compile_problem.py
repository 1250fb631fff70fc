"""Compile workers build binaries on a stand-in problem with fewer experts (a model's full expert
weights per compile process do not fit on one GPU). The stand-in must hand every GEMM launch the
same constexprs and the same integer/pointer specializations, or the measuring worker compiles
again. Checked here by recording each launch's Triton cache-relevant view of its arguments."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from moetune.device import DeviceInfo
from moetune.specs.registry import get_spec


def _view(fn: InterpretedFunction, name: str, value):
    param = inspect.signature(fn.fn).parameters.get(name)
    if param is not None and "constexpr" in str(param.annotation):
        return "constexpr", value
    if name in (fn.kwargs.get("do_not_specialize") or ()):
        return "unspecialized", type(value).__name__
    if isinstance(value, torch.Tensor):
        return "tensor", value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool) or value is None:
        return "value", value
    if isinstance(value, int):  # Triton specializes ints equal to 1 and multiples of 16; i32 vs i64
        return "int", value == 1, value % 16 == 0, -2**31 <= value < 2**31
    return "other", type(value).__name__


H200 = DeviceInfo("NVIDIA H200", "sm_90", 132, 232448, 60 << 20, True)


@pytest.fixture
def launches(monkeypatch):
    """Every Triton launch as (kernel name, its arguments' cache view); nothing runs."""
    seen: list[tuple[str, tuple]] = []

    def record(self, *args, grid, warmup, **kwargs):
        named = list(zip(self.arg_names, args, strict=False)) + sorted(kwargs.items())
        seen.append((self.fn.__name__, tuple((n, _view(self, n, v)) for n, v in named)))

    monkeypatch.setattr(InterpretedFunction, "run", record)
    return seen


def _gemm_launches(spec, problem, config, launches):
    launches.clear()
    spec.run(spec.make_inputs(problem, "cpu", 3), config)
    # the routing helpers' bins follow E by design: they are per problem, not per config
    routing = ("_align", "_chunk_histograms", "_scatter_routes")
    return [rec for rec in launches if not rec[0].startswith(routing)]


CASES = [
    ("fp8_decode.gate_up", {"E": 256, "N": 256, "K": 512, "top_k": 8}, (1, 16, 64, 97), 1.0),
    ("fp8_decode.down", {"E": 256, "N": 256, "K": 256, "top_k": 8}, (2, 16, 40, 256), 1.0),
    # part of the routes inactive: the kernels still see every route slot (decode sweeps 1/2 and 1/4)
    ("fp8_decode.gate_up", {"E": 256, "N": 256, "K": 512, "top_k": 8}, (1, 3, 40, 97), 0.25),
    ("fp8_decode.down", {"E": 256, "N": 256, "K": 256, "top_k": 8}, (1, 16, 50, 256), 0.5),
    # K not a multiple of 256: the sm_90 heuristic names Triton tiles (Gluon's have no interpreter)
    ("fp4_prefill.gate_up", {"E": 128, "N": 128, "K": 384, "top_k": 6}, (16, 128, 700), 1.0),
    ("fp4_prefill.down", {"E": 128, "N": 128, "K": 128, "top_k": 6}, (16, 128, 1000), 1.0),
]


@pytest.mark.interpreter  # records the interpreter's launches (InterpretedFunction.run)
@pytest.mark.parametrize(("kernel", "shape", "tokens", "active"), CASES,
                         ids=[f"{c[0]}-active{c[3]:g}" for c in CASES])
def test_stand_in_builds_the_same_gemm_binaries(kernel, shape, tokens, active, launches):
    spec = get_spec(kernel)
    for t in tokens:
        problem = spec.problem(shape, t, active_fraction=active)
        stand_in = spec.compile_problem(problem)
        assert stand_in.shape["E"] < problem.shape["E"] and stand_in.tokens <= min(t, 32)
        assert {k: v for k, v in stand_in.shape.items() if k != "E"} == \
            {k: v for k, v in problem.shape.items() if k != "E"}
        configs = [spec.default] + [spec.heuristic(problem.shape, r, "sm_90") for r in (8, 128, 4096)]
        configs += [{**configs[-1], "BLOCK_SIZE_M": bm} for bm in spec.space["BLOCK_SIZE_M"]]
        for config in configs:
            if spec.constraint(config, problem, H200):
                continue
            real = _gemm_launches(spec, problem, config, launches)
            assert real, config
            assert _gemm_launches(spec, stand_in, config, launches) == real, (t, config)


def test_stand_in_keeps_what_it_must():
    spec = get_spec("fp8_decode.gate_up")
    shape = {"E": 256, "N": 256, "K": 512, "top_k": 8}
    traced = dataclasses.replace(spec.problem(shape, 4), routing="trace:/some/ids.npy")
    assert spec.compile_problem(traced) is traced  # the trace's ids name the real experts
    part = spec.compile_problem(spec.problem(shape, 100, active_fraction=0.25))
    assert (part.tokens, part.routes, part.active_fraction) == (20, 40, 0.25)  # 100 = 20 mod 16
    small = spec.problem({**shape, "E": 8}, 4)
    assert spec.compile_problem(small) is small
    assert spec.compile_problem(spec.problem({**shape, "E": 200}, 4)).shape["E"] == 8  # 200 = 8 mod 16
    assert spec.compile_problem(spec.problem({**shape, "E": 384}, 4)).shape["E"] == 16
    assert spec.compile_problem(spec.problem({**shape, "E": 385, "top_k": 6}, 4)).shape["E"] == 17
