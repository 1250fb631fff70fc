"""Problems: kernels by name/family/format, shapes from presets or --shape, density grids, routing."""

import numpy as np
import pytest

from moetune.device import INTERPRETER, DeviceInfo
from moetune.specs.registry import all_specs
from moetune.tuner.problems import (
    DECODE_ACTIVE,
    DECODE_TOKENS,
    PREFILL_ROUTES,
    build_plan,
    parse_shape,
    resolve_kernels,
)

GPU = DeviceInfo("NVIDIA H200", "sm_90", 132, 232448, 60 * 2**20, True)


def test_parse_shape():
    assert parse_shape("E=8, N=256,K=512,top_k=2,dtype=bfloat16") == {
        "E": 8, "N": 256, "K": 512, "top_k": 2, "dtype": "bfloat16"}
    for bad in ("", "E8", "E=,N=2"):
        with pytest.raises(ValueError, match="--shape"):
            parse_shape(bad)


def test_resolve_kernels_by_family_and_format():
    names = [s.name for s in all_specs()]
    gather = resolve_kernels(["gather_rows"])
    assert [s.name for s in gather] == ["gather_rows"]
    if "fp4_prefill.gate_up" in names:
        fam = [s.name for s in resolve_kernels(["fp4_prefill"])]
        assert fam == sorted(n for n in names if n.startswith("fp4_prefill."))
        by_format = {s.name for s in resolve_kernels([], "fp4")}
        assert set(fam) <= by_format and "gather_rows" in by_format
        assert not any(n.startswith("fp8_decode") for n in by_format)
    assert len(resolve_kernels([])) == len(names)
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        resolve_kernels(["nope"])
    with pytest.raises(ValueError, match="no kernel serves"):
        resolve_kernels([], "int3")


def test_default_grids_leave_no_density_far_from_a_table_entry():
    """Neighbouring densities of the default grids are at most 1.5x apart (or one token: 1 -> 2)."""
    for grid in (DECODE_TOKENS, PREFILL_ROUTES):
        assert list(grid) == sorted(set(grid))
        assert all(b / a <= 1.5 or b - a == 1 for a, b in zip(grid, grid[1:], strict=False))


def test_gpu_defaults_decode_and_prefill_grids():
    plan = build_plan(["gather_rows"], model="deepseek-v4-flash", tp=2, device=GPU)
    routes = sorted({p.routes for p in plan.problems})
    assert routes == sorted(PREFILL_ROUTES) and {p.active_fraction for p in plan.problems} == {1.0}
    assert all(p.tokens * 6 == p.routes and p.shape["E"] == 256 for p in plan.problems)
    assert plan.notes == []
    decode = [s for s in all_specs() if "decode" in s.name]
    if decode:
        plan = build_plan([decode[0].name], model="deepseek-v3", tp=8, device=GPU)
        assert {p.active_fraction for p in plan.problems} == set(DECODE_ACTIVE)
        assert {p.tokens for p in plan.problems} == set(DECODE_TOKENS)


def test_explicit_grids_and_routes_conversion():
    plan = build_plan(["gather_rows"], shape="E=16,K=256,top_k=4", tokens=[3, 5], active=[1, 0.5],
                      routing=["uniform", "zipf:1.2"], device=GPU)
    got = {(p.tokens, p.routes, p.active_fraction, p.routing) for p in plan.problems}
    assert (3, 6, 0.5, "zipf:1.2") in got and (5, 20, 1.0, "uniform") in got and len(got) == 8
    plan = build_plan(["gather_rows"], shape="E=16,K=256,top_k=4", routes=[64], device=GPU)
    assert [(p.tokens, p.routes, p.density) for p in plan.problems] == [(16, 64, 4.0)]


def test_interpreter_clamps_to_tiny(tmp_path):
    plan = build_plan(["gather_rows"], model="deepseek-v3", tp=8, device=INTERPRETER)
    assert any("interpreter" in n for n in plan.notes)
    assert all(p.shape["E"] == 8 and p.routes <= 256 for p in plan.problems)


def test_trace_routing(tmp_path):
    good, bad = tmp_path / "good.npy", tmp_path / "bad.npy"
    np.save(good, np.array([[0, 3], [5, 7]], dtype=np.int64))
    np.save(bad, np.array([[0, 1, 2]], dtype=np.int64))
    plan = build_plan(["gather_rows"], model="tiny", tokens=[2], routing=[f"trace:{good}"],
                      device=INTERPRETER)
    assert plan.problems[0].routing == f"trace:{good}"
    with pytest.raises(ValueError, match="expected \\[tokens, 2\\]"):
        build_plan(["gather_rows"], model="tiny", tokens=[2], routing=[f"trace:{bad}"], device=INTERPRETER)
    with pytest.raises(ValueError, match="does not exist"):
        build_plan(["gather_rows"], model="tiny", routing=[f"trace:{tmp_path}/none.npy"], device=INTERPRETER)


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "gpt-5"}, "unknown model"),
    ({"model": "deepseek-v3", "tp": 3}, "does not divide"),
    ({}, "give --model or --shape"),
    ({"model": "tiny", "shape": "E=8,N=8,K=8,top_k=2"}, "not both"),
    ({"shape": "E=8,N=128,K=128,top_k=2", "tp": 2}, "--tp/--ep need --model"),
    ({"shape": "E=2,N=128,K=128,top_k=4"}, "top_k 4 exceeds"),
    ({"shape": "E=8,N=128,K=128,top_k=2,colour=red"}, "unknown shape field"),
    ({"model": "tiny", "tokens": [1], "routes": [8]}, "not both"),
    ({"model": "tiny", "routes": [7]}, "not a multiple of"),
    ({"model": "tiny", "tokens": [0]}, ">= 1"),
    ({"model": "tiny", "active": [1.5]}, "\\(0, 1\\]"),
    ({"model": "tiny", "routing": ["skewed"]}, "unknown routing"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_plan(["gather_rows"], device=GPU, **kwargs)


@pytest.mark.parametrize("family, grid", [("fp8_decode", dict(tokens=(1, 2, 64, 128), active=(1.0, 0.25))),
                                          ("fp4_prefill", dict(routes=(768, 49152, 98304)))])
def test_points_with_equal_constraint_keys_share_one_plan_equal_to_their_own(family, grid):
    """The sweep constrains the space once per distinct constraint key; each point's candidates are
    exactly what planning it alone gives."""
    from moetune.models import get_model
    from moetune.tuner.sweep import plan_point, plan_points

    h200 = DeviceInfo("NVIDIA H200", "sm_90", 132, 227 * 1024, 60 << 20, True)
    problems = []
    for spec in resolve_kernels([family]):
        shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v4-flash" if family ==
                                                                     "fp4_prefill" else "deepseek-v3"), tp=8))
        if "routes" in grid:
            problems += [spec.problem(shape, tokens=r // shape["top_k"]) for r in grid["routes"]]
        else:
            problems += [spec.problem(shape, tokens=t, active_fraction=a)
                         for t in grid["tokens"] for a in grid["active"]]
    shared = plan_points(problems, h200)
    alone = [plan_point(pt.spec, pt.problem, h200) for pt in shared]
    for s, a in zip(shared, alone, strict=True):
        assert s.candidate_keys == a.candidate_keys and s.candidates == a.candidates and s.pruned == a.pruned
    distinct = {id(p.keys) for p in shared}
    assert 1 < len(distinct) < len(shared)
    # a spec that does not say what its constraint reads shares nothing
    from moetune.specs.base import KernelSpec

    assert len({KernelSpec.constraint_key(pt.spec, pt.problem) for pt in shared}) == len(shared)
