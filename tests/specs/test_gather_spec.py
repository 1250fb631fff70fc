"""The gather_rows spec: shapes, routed inputs, exact checking, roofline bytes, space and heuristic."""

import math

import pytest
import torch

from moetune.device import INTERPRETER
from moetune.kernels.gather_rows.config import DEFAULT, check_config, group_count
from moetune.models import get_model
from moetune.specs.base import Inputs
from moetune.specs.gather_rows import SPEC
from moetune.specs.registry import get_spec


def test_registered_under_its_op_name():
    assert get_spec("gather_rows") is SPEC
    assert SPEC.exact and SPEC.check_config(DEFAULT) is None


def test_shapes():
    shape = SPEC.shape_from_model(get_model("deepseek-v3"), ep=8)
    assert shape == {"E": 32, "N": 7168, "K": 7168, "top_k": 8}
    assert SPEC.normalize_shape({"E": 8, "K": 896, "top_k": 2})["N"] == 896
    with pytest.raises(ValueError, match="N must equal K"):
        SPEC.normalize_shape({"E": 8, "N": 512, "K": 896, "top_k": 2})
    with pytest.raises(ValueError, match="needs"):
        SPEC.normalize_shape({"E": 8, "top_k": 2})


@pytest.mark.parametrize("routing,active", [("uniform", 1.0), ("zipf:1.2", 0.5)])
def test_inputs_are_routed_rows_and_the_kernel_matches_the_reference(routing, active, device):
    shape = SPEC.shape_from_model(get_model("tiny"))
    problem = SPEC.problem(shape, tokens=6, active_fraction=active, routing=routing)
    inputs = SPEC.make_inputs(problem, device, seed=5)
    idx = inputs.tensors["dst2src"]
    assert idx.numel() == problem.routes
    # Each token once per expert it routes to: round(top_k * active) times.
    assert torch.bincount(idx.long(), minlength=6).tolist() == [round(shape["top_k"] * active)] * 6
    SPEC.poison(inputs)
    expected = SPEC.reference(inputs)
    assert not SPEC.passes(SPEC.error(inputs.outputs, expected))
    SPEC.run(inputs, SPEC.heuristic(shape, problem.routes, "interpreter"))
    assert SPEC.error(inputs.outputs, expected) == 0.0


def test_a_single_flipped_byte_fails_the_exact_check(device):
    problem = SPEC.problem({"E": 4, "K": 200, "top_k": 2}, tokens=3)
    inputs = SPEC.make_inputs(problem, device, seed=1)
    SPEC.run(inputs, DEFAULT)
    expected = SPEC.reference(inputs)
    assert SPEC.passes(SPEC.error(inputs.outputs, expected))
    inputs.outputs[0].view(torch.uint8)[2, 17] ^= 1
    err = SPEC.error(inputs.outputs, expected)
    assert err > 0 and not SPEC.passes(err)


def test_every_allowed_candidate_is_exact_on_a_tiny_problem(device):
    """A miniature sweep: what constraint() lets through must run and be bit-exact."""
    problem = SPEC.problem({"E": 4, "K": 200, "top_k": 2}, tokens=3)
    inputs = SPEC.make_inputs(problem, device, seed=2)
    expected = SPEC.reference(inputs)
    allowed = [c for c in SPEC.candidates() if SPEC.constraint(c, problem, INTERPRETER) is None]
    assert DEFAULT in allowed and 10 < len(allowed) < len(list(SPEC.candidates()))
    for config in allowed:
        SPEC.poison(inputs)
        SPEC.run(inputs, config)
        assert SPEC.error(inputs.outputs, expected) == 0.0, config


def test_bytes_moved_counts_distinct_reads_every_write_and_the_map(device):
    k, g = 896, 7
    problem = SPEC.problem({"E": 8, "K": k, "top_k": 2}, tokens=5)
    idx = torch.tensor([0, 0, 3, 3, 3, 1], dtype=torch.int64, device=device)
    inputs = Inputs({"dst2src": idx}, ())
    assert group_count(k) == g
    assert SPEC.bytes_moved(problem, inputs) == 3 * (k + 4 * g) + 6 * (k + 4 * g + 8)
    assert SPEC.bytes_moved(problem) == 5 * (k + 4 * g) + 10 * (k + 4 * g + 4)
    assert SPEC.flops(problem) == 0


def test_constraint_prunes_what_cannot_pay_off():
    problem = SPEC.problem({"E": 8, "K": 896, "top_k": 2}, tokens=1)
    ok = {"BLOCK_SIZE_K": 1024, "ROWS_PER_PROGRAM": 1, "num_warps": 4}
    assert SPEC.constraint(ok, problem, INTERPRETER) is None
    assert SPEC.constraint(DEFAULT, problem, INTERPRETER) is None  # the baseline always runs
    for bad, word in (({**ok, "BLOCK_SIZE_K": 2048}, "twice K"), ({**ok, "ROWS_PER_PROGRAM": 8}, "rows"),
                      ({**ok, "BLOCK_SIZE_K": 128, "num_warps": 8}, "threads"),
                      ({**ok, "BLOCK": 2}, "unknown")):
        assert word in SPEC.constraint(bad, problem, INTERPRETER)


def test_check_config_rejects_unknown_keys_and_non_powers_of_two():
    assert check_config({}) == DEFAULT
    for bad in ({"BLOCK_M": 16}, {"BLOCK_SIZE_K": 384}, {"ROWS_PER_PROGRAM": 0}, {"num_warps": 2.0}):
        with pytest.raises(ValueError, match="gather_rows"):
            check_config(bad)


@pytest.mark.parametrize("k", [64, 896, 2048, 2880, 7168])
@pytest.mark.parametrize("routes", [1, 8, 512, 8192])
def test_heuristic_is_in_the_space_and_allowed(k, routes):
    problem = SPEC.problem({"E": 8, "K": k, "top_k": 8}, tokens=math.ceil(routes / 8))
    config = SPEC.heuristic(problem.shape, problem.routes, "sm_90")
    assert all(config[key] in values for key, values in SPEC.space.items())
    assert SPEC.constraint(config, problem, INTERPRETER) is None
