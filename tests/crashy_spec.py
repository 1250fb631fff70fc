"""A test-only kernel spec whose configs fail in every way a real candidate can.

``mode`` picks the behaviour: ``ok`` (right answer), ``wrong`` (inaccurate),
``raise`` (RuntimeError: crash), ``refuse`` (ValueError: invalid), ``compile``
(Triton's OutOfResources: compile_error), ``abort`` (os.abort), ``segv`` (reads
address 0), ``hang`` (sleeps forever), ``ima`` (a Triton kernel storing far out of
bounds: a real illegal memory access; GPU only, pruned elsewhere), ``pruned``
(rejected by the constraint). ``v`` multiplies the ok candidates. The environment
variable ``CRASHY_SLEEP`` (seconds) slows every run, for tests that kill a sweep
part-way. Importing registers it.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import torch
import triton
import triton.language as tl

from moetune.problem import Problem
from moetune.specs.base import Inputs, KernelSpec
from moetune.specs.registry import register

MODES = ("ok", "wrong", "raise", "refuse", "compile", "abort", "segv", "hang", "ima", "pruned")


@triton.jit
def _far_store(ptr):
    tl.store(ptr + (1 << 40), 1.0)  # a terabyte past the buffer: an illegal memory access


class CrashySpec(KernelSpec):
    name = "test.crashy"
    description = "test-only op whose configs crash, hang, raise or lie"
    space = {"mode": MODES, "v": (0, 1, 2)}
    default = {"mode": "ok", "v": 0}
    tolerance = 1e-3

    def shape_from_model(self, model, tp=1, ep=1) -> dict[str, Any]:
        e, i = model.per_rank(tp, ep)
        return {"E": e, "N": i, "K": 64, "top_k": model.top_k}

    def constraint(self, config, problem: Problem, device) -> str | None:
        if problem.shape["K"] == 1:
            return "K=1 leaves nothing to tune"
        if config["mode"] == "pruned":
            return "pruned by the test constraint"
        if config["mode"] == "ima" and not device.is_gpu:
            return "illegal memory access needs a GPU"
        if config["mode"] != "ok" and config["v"]:
            return "only ok configs vary"
        return None

    def make_inputs(self, problem: Problem, device: str, seed: int) -> Inputs:
        g = torch.Generator().manual_seed(seed)
        x = (torch.rand(problem.routes, problem.shape["K"], generator=g) + 0.5).to(device)
        return Inputs({"x": x}, (torch.empty_like(x),))

    def run(self, inputs: Inputs, config) -> None:
        mode, out, x = config["mode"], inputs.outputs[0], inputs.tensors["x"]
        time.sleep(float(os.environ.get("CRASHY_SLEEP", "0")))
        if mode == "raise":
            raise RuntimeError("candidate raised")
        if mode == "refuse":
            raise ValueError("config refused by the launcher")
        if mode == "compile":
            from triton.runtime.errors import OutOfResources

            raise OutOfResources(300_000, 232_448, "shared memory")
        if mode == "abort":
            os.abort()
        if mode == "segv":
            ctypes.string_at(0)
        if mode == "hang":
            time.sleep(3600)
        if mode == "ima":
            _far_store[(1,)](out)
        torch.mul(x, 2.0, out=out)
        if mode == "wrong":
            out.add_(1.0)

    def reference(self, inputs: Inputs):
        return (inputs.tensors["x"].double() * 2.0,)

    def bytes_moved(self, problem: Problem, inputs=None) -> int:
        return 2 * 4 * problem.routes * problem.shape["K"]

    def flops(self, problem: Problem, inputs=None) -> int:
        return problem.routes * problem.shape["K"]


SPEC = register(CrashySpec())


class SteadySpec(CrashySpec):
    """Only good configs: for resume and concurrency tests, where every candidate must land once."""

    name = "test.steady"
    description = "test-only op whose configs all work"
    space = {"mode": ("ok",), "v": tuple(range(6))}


STEADY = register(SteadySpec())


class WideSteadySpec(SteadySpec):
    """Enough good configs for adaptive strategies to reserve a final re-measurement."""

    name = "test.steady_wide"
    space = {"mode": ("ok",), "v": tuple(range(48))}


STEADY_WIDE = register(WideSteadySpec())


class BrokenReferenceSpec(SteadySpec):
    """Good configs, but the spec's own ``FAULTY_STAGE`` (reference, make_inputs or make_weights) raises
    ValueError while that variable is set: the point's failure, never the configs'."""

    name = "test.bad_reference"
    description = "test-only op whose reference or input maker may raise"

    @staticmethod
    def _maybe_fail(stage: str) -> None:
        if os.environ.get("FAULTY_STAGE") == stage:
            raise ValueError(f"{stage} broke")

    def make_weights(self, problem: Problem, device: str, seed: int) -> Any:
        self._maybe_fail("make_weights")
        return None

    def make_inputs(self, problem: Problem, device: str, seed: int, *, weights: Any = None) -> Inputs:
        self._maybe_fail("make_inputs")
        return super().make_inputs(problem, device, seed)

    def reference(self, inputs: Inputs):
        self._maybe_fail("reference")
        return super().reference(inputs)


BAD_REFERENCE = register(BrokenReferenceSpec())


class LandscapeSpec(SteadySpec):
    """Good configs whose run is fast for one ``v`` a point and slow for the rest: ``v`` 3 at 3 tokens, 7
    elsewhere, so the best is known (the sleeps are far wider than the interpreter's timing noise)."""

    name = "test.landscape"
    description = "test-only op with a known best per point"
    space = {"mode": ("ok",), "v": tuple(range(48))}
    FAST_MS, SLOW_MS = 1.0, 8.0

    @staticmethod
    def fast(tokens: int) -> int:
        return 3 if tokens == 3 else 7

    def make_inputs(self, problem: Problem, device: str, seed: int) -> Inputs:
        inputs = super().make_inputs(problem, device, seed)
        inputs.extra["fast"] = self.fast(problem.tokens)
        return inputs

    def run(self, inputs: Inputs, config) -> None:
        fast = config["v"] == inputs.extra["fast"]
        time.sleep((self.FAST_MS if fast else self.SLOW_MS) / 1e3)
        super().run(inputs, config)


LANDSCAPE = register(LandscapeSpec())
