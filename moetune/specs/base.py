"""Kernel specs: each tunable op described once; the tuner, tables and picker iterate over these.

A spec says what can be tuned (its space and constraints), how to build a
problem's inputs, how to run one config, what the right answer is, and how
many bytes and flops the problem needs for its roofline. Built-in specs live in
``moetune.specs``; third-party ones register through the ``moetune.kernels``
entry-point group (see README), or by calling :func:`register`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from moetune.device import DeviceInfo
from moetune.kernels.rules import TileRules
from moetune.models import ModelPreset
from moetune.problem import Config, Problem, canonical_json


@dataclass
class Inputs:
    """Tensors for one problem; ``outputs`` are preallocated and written by ``run``."""

    tensors: dict[str, Any]
    outputs: tuple[torch.Tensor, ...]
    extra: dict[str, Any] = field(default_factory=dict)


class KernelSpec(TileRules):
    """Base class of a tunable op. Subclasses set the class attributes and override methods.

    Class attributes:
        name: op name as tables and the CLI use it, e.g. ``"fp8_decode.gate_up"``.
        space: tunable parameter -> candidate values (the full grid before constraints).
        default: the shipped default config (also the baseline every point is timed against).
        shape_defaults: optional shape fields and their defaults (e.g. a dtype).
        tolerance: largest accepted relative L2 error (ignored when ``exact``).
        exact: outputs must match the reference bit for bit (compared on integer views).
        cuda_graph: time under CUDA-graph replay (launch-bound decode ops).
        weight_format: which models' checkpoints this op serves (matches ModelPreset.weight_format);
            None means any.
    """

    tolerance: float = 1e-2
    exact: bool = False
    cuda_graph: bool = False
    weight_format: str | None = None

    # ---- shapes and densities -------------------------------------------------
    def shape_from_model(self, model: ModelPreset, tp: int = 1, ep: int = 1) -> dict[str, Any]:
        """The op's shape for one rank of ``model``."""
        raise NotImplementedError

    # ---- the search space --------------------------------------------------------
    def candidates(self) -> Iterator[Config]:
        keys = list(self.space)
        for values in itertools.product(*(self.space[k] for k in keys)):
            yield dict(zip(keys, values, strict=True))

    def dominated(self, config: Config, device: DeviceInfo, shape: Mapping[str, Any] | None = None
                  ) -> str | None:
        """Why a sweep need not try ``config`` on ``device`` although the kernel runs it (None when it
        should): a design that measurements on this kind of device show never wins (at ``shape``, where
        given; None: at any shape the kernel runs it at). Unlike
        :meth:`constraint` this only narrows the search (``moetune sweep --full-space`` ignores it);
        tables and explicit configs may still use such a design. Default: nothing is dominated."""
        return None

    def design(self, config: Config) -> str:
        """The design ``config`` belongs to: the switches that pick another kernel, not its tiles. A grid
        budget gives more to a point whose best has a close runner-up of another design (a boundary
        the search may not have settled; docs/tuner.md, "The grid budget"). Default: one design."""
        return ""

    def canonical(self, config: Config) -> Config:
        """One representative of the configs that build the same kernel (keys the kernel ignores in
        this config set to what the constraint keeps); export pools stored rows of equivalent configs
        under it. Default: every key matters."""
        return dict(config)

    def compile_problem(self, problem: Problem) -> Problem:
        """A problem whose inputs build the same binaries as ``problem``'s, for the compile workers.

        Compile launches never run, so their inputs' contents do not matter, but a dozen compile
        processes each holding a model's full expert weights do not fit on one GPU (DeepSeek-V3 at
        TP 1: 7.5 GB a set). A spec whose kernels see the expert count only through unspecialized
        arguments returns a smaller problem here (see :func:`fewer_experts`). A mismatch costs speed
        only: the measuring worker compiles what the cache lacks. Default: ``problem`` itself."""
        return problem

    def constraint_key(self, problem: Problem) -> Hashable:
        """What :meth:`constraint` and :meth:`dominated` read of ``problem``: a sweep plans points with
        equal keys (on one device) once. The default, the whole problem, shares nothing; a spec whose
        constraint reads only the shape and a capped route count says so, and its densities share a plan."""
        return (problem.kernel, problem.shape_key, problem.tokens, problem.routes, problem.active_fraction,
                problem.routing)

    def compile_cost(self, config: Config) -> float:
        """A guess at how long ``config`` takes to compile, to start a batch's slowest compiles first
        (a batch waits for its last one). Default: the product of its ``BLOCK_SIZE_*`` tiles times
        num_stages over num_warps, which ranks measured compile times well (see docs/tuner.md,
        "Compile order")."""
        cost = float(config.get("num_stages", 1)) / float(config.get("num_warps", 4))
        for key, value in config.items():
            if key.startswith("BLOCK_SIZE_") and isinstance(value, int):
                cost *= value
        return cost

    def binary_key(self, config: Config) -> str:
        """What of ``config`` picks the compiled binary: configs with equal keys run one binary (their
        other keys are run-time arguments), so a sweep compiles one of them and the rest find it in
        Triton's cache. Default: the whole (canonical) config."""
        return canonical_json(self.canonical(config))

    def launch_contract(self, arch: str) -> str | None:
        """How ``run`` launches its kernels on ``arch`` where that changes their time (e.g. "pdl" for
        programmatic dependent launch), recorded with every measurement. Export ranks a point on the
        rows of the current contract where it has any, so a change of launch path supersedes the rows
        timed the old way. None (the default): the op has one launch path."""
        return None

    # ---- running -------------------------------------------------------------------
    def make_weights(self, problem: Problem, device: str, seed: int) -> Any:
        """The large, config-independent part of the inputs (e.g. quantized expert weights), or None
        when the spec does not split its inputs (the default: third-party specs need not).

        Drawing a gigabyte of weights per candidate is most of a sweep's overhead, so the tuner makes a
        few weight sets once per (kernel, shape) and worker and hands one to
        ``make_inputs(..., weights=...)``, which then draws only the fresh, per-candidate parts
        (activations, routes, outputs). Must depend only on ``problem.shape`` and ``seed``.
        """
        return None

    def make_inputs(self, problem: Problem, device: str, seed: int, *, weights: Any = None) -> Inputs:
        """Fresh random inputs (never zeros) for ``problem`` on ``device``.

        ``weights``: a :meth:`make_weights` result to use instead of drawing new weights (only passed
        to specs whose ``make_weights`` returns something).
        """
        raise NotImplementedError

    def run(self, inputs: Inputs, config: Config) -> None:
        """Run the op with ``config``, writing ``inputs.outputs`` in place."""
        raise NotImplementedError

    def reference(self, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        """Expected outputs, computed in fp32 or better from the same quantized data."""
        raise NotImplementedError

    def collect(self, inputs: Inputs, config: Config) -> None:
        """After ``run`` and before the accuracy check, never timed: bring what ``run`` wrote into
        ``inputs.outputs``' form, for an op whose natural output is not the reference's (e.g. K-split
        partials that the next kernel of the layer sums as it reads them). Default: nothing."""

    def poison(self, inputs: Inputs) -> None:
        """Fill outputs with NaN (float) or 0xA5 bytes so unwritten elements are caught."""
        for t in inputs.outputs:
            if t.is_floating_point() and t.element_size() > 1:
                t.fill_(float("nan"))
            else:
                t.view(torch.uint8).fill_(0xA5)

    def error(self, outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
        """Relative L2 error (inf on NaN/inf); for exact specs, the fraction of differing bytes."""
        worst = 0.0
        for out, ref in zip(outputs, expected, strict=True):
            if out.shape != ref.shape:
                return math.inf
            if self.exact:
                a, b = out.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8)
                worst = max(worst, (a != b).float().mean().item() if a.numel() else 0.0)
                continue
            # fp32 norms, one host sync: a NaN or inf output makes the difference's norm non-finite.
            # (float64 copies cost a fp4 check at 98304 routes gigabytes of traffic for no verdict it
            # needs: the tolerance is 1e-2.)
            r = ref.float()
            num, den = torch.stack([torch.linalg.vector_norm(out.float() - r),
                                    torch.linalg.vector_norm(r)]).tolist()
            if not math.isfinite(num):
                return math.inf
            worst = max(worst, num / den if den > 0 else (0.0 if num == 0 else math.inf))
        return worst

    def passes(self, err: float) -> bool:
        return err == 0.0 if self.exact else err <= self.tolerance

    # ---- roofline ------------------------------------------------------------------
    def bytes_moved(self, problem: Problem, inputs: Inputs | None = None) -> int:
        """Fewest bytes the op must move through device memory (exact when ``inputs`` are given,
        e.g. counting the distinct experts the drawn routes touch; expected value otherwise)."""
        raise NotImplementedError

    def flops(self, problem: Problem, inputs: Inputs | None = None) -> int:
        raise NotImplementedError

    def problem(self, shape: Mapping[str, Any], tokens: int, active_fraction: float = 1.0,
                routing: str = "uniform") -> Problem:
        shape = self.normalize_shape(shape)
        routes = int(round(tokens * shape["top_k"] * active_fraction))
        return Problem(self.name, shape, tokens, routes, active_fraction, routing)


def fewer_experts(problem: Problem) -> Problem:
    """``problem`` with the fewest experts and tokens Triton cannot tell from the real ones, for
    :meth:`KernelSpec.compile_problem`: the same residues mod 16 (so the same specialization of E,
    the token count and the route slots: 1, a multiple of 16 or neither), at least ``top_k``
    experts, the same active fraction. For ops whose kernels take E-dependent integers only
    unspecialized (``do_not_specialize``). Fewer tokens also keep the compile workers' GPU work
    (activations, route alignment) small: it shares the GPU with timed runs. Trace routing keeps
    the problem (its ids name the real experts)."""
    e, top_k = problem.shape["E"], problem.shape["top_k"]
    if problem.routing.startswith("trace:"):
        return problem
    shape = dict(problem.shape)
    if e > 1:
        shape["E"] = min(e, next(x for x in itertools.count(e % 16 or 16, 16) if x >= max(2, top_k)))
    tokens = problem.tokens if problem.tokens <= 32 else 16 + problem.tokens % 16
    routes = int(round(tokens * top_k * problem.active_fraction))
    out = replace(problem, shape=shape, tokens=tokens, routes=routes)
    return problem if out == problem else out
