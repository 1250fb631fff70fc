"""The fp8_decode.gate_up / fp8_decode.down kernel specs: shapes, space, constraints, heuristic, run."""

import re

import pytest
import torch

from moetune.device import INTERPRETER, DeviceInfo
from moetune.models import get_model
from moetune.problem import canonical_json
from moetune.specs.registry import all_specs, get_spec

NAMES = ("fp8_decode.gate_up", "fp8_decode.down")
H200 = DeviceInfo("NVIDIA H200", "sm_90", 132, 227 * 1024, 60 << 20, True)


def test_registered_with_contract():
    names = {s.name for s in all_specs()}
    for name in NAMES:
        spec = get_spec(name)
        assert name in names
        assert spec.cuda_graph and spec.tolerance == 1e-2 and spec.weight_format == "fp8_block"
        assert spec.default["ALGO"] == "route" and spec.default["BLOCK_SIZE_N"] == 16
        assert spec.default["BLOCK_SIZE_K"] == 128 and spec.default["num_warps"] == 4
        spec.check_config(spec.default)


def test_shape_from_model():
    ds = get_model("deepseek-v3")
    assert get_spec(NAMES[0]).shape_from_model(ds, tp=8) == {
        "E": 256, "N": 512, "K": 7168, "top_k": 8, "dtype": "bfloat16"}
    assert get_spec(NAMES[1]).shape_from_model(ds, tp=8, ep=2) == {
        "E": 128, "N": 7168, "K": 256, "top_k": 8, "dtype": "bfloat16"}
    with pytest.raises(ValueError, match="dtype"):
        get_spec(NAMES[0]).normalize_shape({"E": 4, "N": 8, "K": 8, "top_k": 2, "dtype": "int8"})


@pytest.mark.parametrize("name", NAMES)
def test_constraints_prune_without_duplicates(name):
    spec = get_spec(name)
    shape = spec.shape_from_model(get_model("deepseek-v3"), tp=8)
    problem = spec.problem(shape, tokens=4)
    ok = [c for c in spec.candidates() if spec.constraint(c, problem, H200) is None]
    assert ok and len(ok) < len(list(spec.candidates()))
    assert all(c["BLOCK_SIZE_M"] == 16 for c in ok if c["ALGO"] == "route")
    assert all(c["BLOCK_SIZE_N"] <= 128 and c["SWAP_AB"] == 0 for c in ok if c["ALGO"] == "route")
    bad = {**spec.default, "SPLIT_K": 16, "BLOCK_SIZE_K": min(512, shape["K"])}
    assert "SPLIT_K" in spec.constraint(bad, problem, H200)  # 14 (K 7168) or 1 (K 256) K blocks
    assert "BLOCK_SIZE_K" in spec.constraint({**spec.default, "BLOCK_SIZE_K": 64}, problem, H200)
    assert "unknown" in spec.constraint({**spec.default, "GROUP_SIZE_M": 8}, problem, H200)
    tiny = DeviceInfo("tiny", "sm_80", 1, 16 * 1024, 0, True)
    big = {**spec.default, "ALGO": "grouped", "BLOCK_SIZE_N": 256, "num_stages": 4}
    assert "shared memory" in spec.constraint(big, problem, tiny)


def test_candidates_per_design_keep_what_the_full_product_keeps():
    """The spec enumerates its space per design (GEMV keys only on the GEMV, tl.dot keys only off it):
    the configs that pass the constraint are exactly the full product's, from far fewer raw ones."""
    from moetune.specs.base import KernelSpec

    spec = get_spec("fp8_decode.down")
    spec = type(spec)()  # a copy whose space can shrink to keep the full product small
    spec.space = {**spec.space, "BLOCK_SIZE_N": [32, 128], "SPLIT_K": [1, 2], "num_warps": [2, 4]}
    problem = spec.problem(spec.normalize_shape({"E": 8, "N": 512, "K": 256, "top_k": 2}), tokens=4)

    def kept(configs):
        out = set()
        for c in configs:
            try:
                spec.check_config(c)
            except ValueError:
                continue
            if spec.constraint(c, problem, H200) is None:
                out.add(canonical_json(spec.canonical(c)))
        return out

    mine, full = list(spec.candidates()), list(KernelSpec.candidates(spec))
    assert kept(mine) == kept(full) and len(mine) * 10 < len(full)
    assert any(c["GEMV_STAGES"] > 1 for c in mine) and any(c["SWAP_AB"] for c in mine)


@pytest.mark.parametrize("name", NAMES)
def test_m_blocks_of_mostly_padding_are_pruned(name):
    """Grouped M tiles up to 8x the routes per expert (at least 16) with uniform routing: DeepSeek-V3 TP8
    (256 experts) keeps only M 16 up to 64 tokens (2 routes an expert) and gets M 32 and 64 back at
    256 (8 an expert); skewed routing keeps the bound by routes, since one expert may take most."""
    spec = get_spec(name)
    shape = spec.shape_from_model(get_model("deepseek-v3"), tp=8)
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "SWAP_AB": 1, "num_stages": 3}
    for tokens, routing, allowed in ((16, "uniform", (16,)), (64, "uniform", (16,)),
                                     (256, "uniform", (16, 32, 64)), (16, "zipf:1.2", (16, 32, 64))):
        problem = spec.problem(shape, tokens, routing=routing)
        for bm in (16, 32, 64):
            reason = spec.constraint({**tile, "BLOCK_SIZE_M": bm}, problem, H200)
            assert (reason is None) == (bm in allowed), (tokens, routing, bm, reason)
            if reason:
                assert "padding" in reason


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("model,tp", [("deepseek-v3", 8), ("qwen3-30b-a3b", 1), ("kimi-k2", 4), ("tiny", 1)])
def test_heuristic_is_valid_and_follows_density(name, model, tp):
    spec = get_spec(name)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(model), tp=tp))
    algos = []
    for tokens in (1, 4, 16, 64, 256):
        problem = spec.problem(shape, tokens)
        cfg = spec.heuristic(shape, problem.routes, "sm_90")
        assert spec.constraint(cfg, problem, H200) is None, (tokens, cfg)
        algos.append(cfg["ALGO"])
        spec.check_config(spec.heuristic(shape, problem.routes, "interpreter"))
    assert algos[0] == "route" and algos[-1] == "grouped"


@pytest.mark.parametrize("name", NAMES)
def test_run_matches_reference_with_poisoned_outputs(name, device):
    spec = get_spec(name)
    shape = spec.shape_from_model(get_model("tiny"))
    problem = spec.problem(shape, tokens=3, active_fraction=0.5)
    inputs = spec.make_inputs(problem, device, seed=1)
    expected = spec.reference(inputs)
    for cfg in (spec.default, spec.heuristic(problem.shape, problem.routes, "interpreter"),
                {"ALGO": "grouped", "BLOCK_SIZE_N": 128, "SPLIT_K": 2, "SWAP_AB": 1}):
        spec.poison(inputs)
        spec.run(inputs, cfg)
        spec.collect(inputs, cfg)
        assert spec.passes(spec.error(inputs.outputs, expected)), cfg
    assert 0 < spec.bytes_moved(problem, inputs) <= spec.bytes_moved(spec.problem(shape, tokens=64))
    assert spec.flops(problem) == 2 * problem.routes * shape["N"] * shape["K"]


def test_a_k_split_is_timed_without_its_sum(device):
    """SPLIT_K > 1: run writes only the [split, routes, N] partials (the layer's next kernel adds them);
    collect, untimed, adds them for the check; poison reaches the partials too, so a partial a run
    left unwritten cannot pass on an earlier run's values."""
    spec = get_spec("fp8_decode.gate_up")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), tokens=2)
    inputs = spec.make_inputs(problem, device, seed=2)
    expected = spec.reference(inputs)
    cfg = {**spec.default, "BLOCK_SIZE_K": 128, "SPLIT_K": 2}
    spec.poison(inputs)
    spec.run(inputs, cfg)
    assert torch.isnan(inputs.outputs[0]).all()  # no sum launched by run
    spec.collect(inputs, cfg)
    assert spec.passes(spec.error(inputs.outputs, expected))
    spec.poison(inputs)
    parts = inputs.extra["partials"][2]
    assert torch.isnan(parts).all()


def test_down_takes_its_a_fp8_2_split_made_beforehand_as_the_layer_does(monkeypatch, device):
    """The layer's gated activation writes down's A_FP8 2 split, so down's timed op launches none: the
    split is made on the first run and reused; gate/up splits x in every run, as the layer does."""
    from moetune.kernels.fp8_decode import gemm
    from moetune.specs import fp8_decode as spec_module

    calls = []
    real = gemm.split_fp8_rows

    def split(a, *k, **kw):
        calls.append(a.shape)
        return real(a, *k, **kw)

    for module in (spec_module, gemm):  # the spec's own split and the one fp8_block_gemm launches
        monkeypatch.setattr(module, "split_fp8_rows", split)
    for name, per_run in (("fp8_decode.down", 0), ("fp8_decode.gate_up", 1)):
        spec = get_spec(name)
        problem = spec.problem(spec.shape_from_model(get_model("tiny")), tokens=2)
        inputs = spec.make_inputs(problem, device, seed=3)
        expected = spec.reference(inputs)
        cfg = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
        calls.clear()
        spec.poison(inputs)
        spec.run(inputs, cfg)
        assert spec.passes(spec.error(inputs.outputs, expected)), name
        spec.run(inputs, cfg)
        spec.run(inputs, cfg)
        assert len(calls) == 1 + 2 * per_run, name
        spec.run(inputs, {**cfg, "A_FP8": 0})  # no split for the W16 path
        assert len(calls) == 1 + 2 * per_run, name


def test_kernel_only_takes_the_alignment_and_both_splits_made_beforehand(monkeypatch, device):
    """TimingOptions.kernel_only (the worker marks the inputs): the grouped path's alignment and gate/up's
    split of x are made on the first run and reused, as a layer shares them; the whole op otherwise."""
    from moetune.kernels.fp8_decode import gemm
    from moetune.specs import fp8_decode as spec_module

    calls = {"split": 0, "align": 0}
    real_split, real_align = gemm.split_fp8_rows, gemm.align_routes

    def split(*a, **kw):
        calls["split"] += 1
        return real_split(*a, **kw)

    def align(*a, **kw):
        calls["align"] += 1
        return real_align(*a, **kw)

    for module in (spec_module, gemm):  # the spec's own calls and fp8_block_gemm's
        monkeypatch.setattr(module, "split_fp8_rows", split)
        monkeypatch.setattr(module, "align_routes", align)
    spec = get_spec("fp8_decode.gate_up")
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), tokens=2)
    cfg = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
    for kernel_only, per_run in ((True, 0), (False, 1)):
        inputs = spec.make_inputs(problem, device, seed=4)
        if kernel_only:
            inputs.extra["kernel_only"] = True
        expected = spec.reference(inputs)
        calls.update(split=0, align=0)
        for _ in range(3):
            spec.poison(inputs)
            spec.run(inputs, cfg)
            assert spec.passes(spec.error(inputs.outputs, expected))
        assert calls == {"split": 1 + 2 * per_run, "align": 1 + 2 * per_run}, kernel_only


def test_interpreter_device_constraint_accepts_default():
    spec = get_spec(NAMES[0])
    problem = spec.problem(spec.shape_from_model(get_model("tiny")), tokens=1)
    assert spec.constraint(spec.default, problem, INTERPRETER) is None


@pytest.mark.parametrize("name", NAMES)
def test_heuristic_uses_fp8_dots_only_where_measured(name):
    """sm_90 (measured): activations split into fp8 terms (A_FP8 2) on tensor cores, grouped above 1 row
    per expert, except the short-K down GEMM's W8A16 GEMV at few routes; other archs (no fp8 dots before
    sm_89, unmeasured after) keep W8A16; the shipped default is untouched."""
    spec = get_spec(name)
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    dense = spec.heuristic(shape, 64 * 8, "sm_90")
    assert dense["ALGO"] == "grouped" and dense["A_FP8"] == 2 and dense["SWAP_AB"] == 1
    assert spec.heuristic(shape, 64 * 8, "sm_80")["A_FP8"] == 0
    one = spec.heuristic(shape, 8, "sm_90")  # W8A16 GEMVs: one launch (gate/up: 4096 rows of output)
    assert one["ALGO"] == "route" and one["A_FP8"] == 0
    two = spec.heuristic(shape, 16, "sm_90")
    assert two["ALGO"] == "route" and two["A_FP8"] == (2 if name.endswith("gate_up") else 0)
    mid = spec.heuristic(shape, 16 * 8, "sm_90")
    assert mid["ALGO"] == ("route" if name.endswith("gate_up") else "grouped")
    for tokens in (1, 4, 16, 64, 256):
        problem = spec.problem(shape, tokens=tokens)
        assert spec.constraint(spec.heuristic(shape, problem.routes, "sm_90"), problem, H200) is None
    assert spec.default["A_FP8"] == 0 and spec.default["BLOCK_SIZE_N"] == 16


def test_sm90_long_k_route_splits_only_until_two_programs_per_sm():
    """K 7168 (DeepSeek-V3) with 8 tiles of N per route splits 4 ways at 2 tokens and not at 16; K 2048
    with 24 tiles (Qwen3-30B) splits 2 ways at 1 token; deeper pipelines where the split is small."""
    spec = get_spec("fp8_decode.gate_up")
    for model, tp, tokens, split, stages in (("deepseek-v3", 8, 2, 4, 3), ("deepseek-v3", 8, 16, 1, 4),
                                             ("qwen3-30b-a3b", 1, 1, 2, 4), ("qwen3-30b-a3b", 1, 16, 1, 4)):
        shape = spec.normalize_shape(spec.shape_from_model(get_model(model), tp=tp))
        problem = spec.problem(shape, tokens=tokens)
        got = spec.heuristic(shape, problem.routes, "sm_90")
        assert (got["ALGO"], got["SPLIT_K"], got["num_stages"]) == ("route", split, stages), (model, tokens)
        assert spec.constraint(got, problem, H200) is None


def test_the_w8a16_gemv_compiles_the_same_sm90_binary_for_every_num_stages():
    """Why the constraint keeps the W8A16 GEMV at num_stages 1: the kernel's num_stages pipelines only
    loads that feed tl.dot, so every value builds the same binary (compiled for sm_90 without a GPU;
    the loop's own request, GEMV_STAGES, does pipeline them). A Triton that starts pipelining these loads
    for the kernel's num_stages fails this test, and the constraint must go."""
    from sm90_compile import compile_sm90

    types = {"a_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "ids_ptr": "*i32", "rw_ptr": "*fp32",
             "out_ptr": "*fp32"}
    const = {"APPLY_WEIGHT": False, "A_ROW_DIV": 8, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "PDL": False,
             "GEMV_STAGES": 1, "PERSISTENT": False, "R_P2": 1}
    got = compile_sm90([{"kernel": "moetune.kernels.fp8_decode.gemm._route_gemm_kernel", "const": const,
                         "types": types, "options": {"num_warps": 4, "num_stages": st}} for st in (1, 2, 4)])
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    assert len({g["cubin"] for g in got}) == 1

    spec = get_spec("fp8_decode.gate_up")
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    problem = spec.problem(shape, tokens=1)
    gemv = {**spec.default, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "SPLIT_K": 4}
    assert spec.constraint({**gemv, "num_stages": 1}, problem, H200) is None
    assert "num_stages" in spec.constraint({**gemv, "num_stages": 3}, problem, H200)
    assert spec.constraint({**gemv, "A_FP8": 2, "num_stages": 3}, problem, H200) is None


def test_gemv_stages_pipeline_the_w8a16_gemv_and_nothing_else():
    """GEMV_STAGES > 1 asks the GEMV's K loop for a software pipeline (cp.async through shared memory,
    compiled for sm_90 without a GPU); 1 builds the GEMV as before. Only the plain GEMV takes it, and the
    staged tiles count against shared memory."""
    from sm90_compile import compile_sm90

    types = {"a_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "ids_ptr": "*i32", "rw_ptr": "*fp32",
             "out_ptr": "*fp32"}
    const = {"APPLY_WEIGHT": False, "A_ROW_DIV": 8, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 512,
             "PREFETCH": False, "PDL": False, "PERSISTENT": False, "R_P2": 1}
    got = compile_sm90([{"kernel": "moetune.kernels.fp8_decode.gemm._route_gemm_kernel",
                         "const": {**const, "GEMV_STAGES": st}, "types": types,
                         "aligned": ["a_ptr", "w_ptr", "s_ptr", "ids_ptr", "rw_ptr", "out_ptr", "stride_am",
                                     "stride_we", "stride_wn", "N", "K"],
                         "options": {"num_warps": 8, "num_stages": 1}} for st in (1, 3)])
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    assert "cp.async" not in got[0]["ptx"] and "cp.async" in got[1]["ptx"]

    spec = get_spec("fp8_decode.gate_up")
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    problem = spec.problem(shape, tokens=1)
    gemv = {**spec.default, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 512, "SPLIT_K": 4, "num_warps": 8}
    wide = {**gemv, "BLOCK_SIZE_N": 128, "GEMV_STAGES": 4}  # 3 x 65 KB staged
    assert spec.constraint(wide, problem, H200) is None
    a100 = DeviceInfo("NVIDIA A100", "sm_80", 108, 166912, 40 << 20, True)
    assert "shared memory" in spec.constraint(wide, problem, a100)
    assert spec.constraint({**wide, "GEMV_STAGES": 3}, problem, a100) is None
    for other in ({"A_FP8": 2}, {"ALGO": "grouped"}, {"PREFETCH": 1, "BLOCK_SIZE_K": 128}):
        with pytest.raises(ValueError, match="GEMV_STAGES"):
            spec.check_config({**gemv, **other, "GEMV_STAGES": 2})


def test_every_split_k_of_a_tile_runs_one_binary():
    """SPLIT_K only sets each program's K range, so the GEMM kernels take it at run time, unspecialized,
    as the K blocks each split takes: DeepSeek-V3 TP8 gate/up's space at 256 tokens, 24162 configs,
    needs 5094 binaries, not 24162. The sm_90 code divides nothing per program for it, nor for the
    activation row (A_ROW_DIV is a constexpr; compiled here without a GPU): down's default tile runs
    many short programs. The spec's binary_key says so, which is how a sweep orders its compiles."""
    from sm90_compile import compile_sm90, param_flags

    kernels = [f"moetune.kernels.fp8_decode.gemm.{k}"
               for k in ("_route_gemm_kernel", "_route_dot_kernel", "_grouped_gemm_kernel")]
    assert param_flags(kernels, "SPLIT_ITERS") == [(False, True)] * 3  # not constexpr, never specialized
    types = {"a_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "ids_ptr": "*i32", "rw_ptr": "*fp32",
             "out_ptr": "*fp32"}
    const = {"APPLY_WEIGHT": True, "A_ROW_DIV": 1, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128, "PREFETCH": False,
             "GEMV_STAGES": 1, "PDL": False, "PERSISTENT": False, "R_P2": 1}
    got = compile_sm90([{"kernel": kernels[0], "const": const, "types": types,
                         "options": {"num_warps": 4, "num_stages": 1}}])
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    assert not re.search(r"\b(div|rem)\.[su]32", got[0]["ptx"])
    spec = get_spec("fp8_decode.gate_up")
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3}
    assert spec.binary_key({**tile, "SPLIT_K": 1}) == spec.binary_key({**tile, "SPLIT_K": 8})
    assert spec.binary_key(tile) != spec.binary_key({**tile, "num_stages": 4})
    gemv = {**spec.default, "num_stages": 3}  # canonical first: the GEMV's stages are one kernel
    assert spec.binary_key(gemv) == spec.binary_key({**gemv, "num_stages": 1, "SPLIT_K": 2})


def test_rows_of_gemv_configs_that_differ_only_in_num_stages_export_as_one(tmp_path):
    """Stored before the constraint existed: the same W8A16 GEMV at num_stages 1 and 3 is one kernel, so
    export pools both rows under num_stages 1 and the table passes the constraints."""
    from moetune.tables.format import read, table_path
    from moetune.tuner.export import export
    from moetune.tuner.store import Store
    from moetune.tuner.verify import verify

    spec = get_spec("fp8_decode.down")
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    gemv = {**spec.default, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "num_warps": 8}
    base = dict(kernel=spec.name, device_name="NVIDIA H200", arch="sm_90", shape=canonical_json(shape),
                tokens=1, routes=8, active_fraction=1.0, routing="uniform", density=8 / 256, status="ok",
                error=1e-7, spread=0.01, triton_version="3.6.0", strategy="model")
    with Store(tmp_path / "r.sqlite") as s:
        s.add({**base, "config": canonical_json(spec.default), "time_ms": 0.010})
        s.add({**base, "config": canonical_json({**gemv, "num_stages": 3}), "time_ms": 0.0074})
        s.add({**base, "config": canonical_json({**gemv, "num_stages": 1}), "time_ms": 0.0076})
    assert export(tmp_path / "r.sqlite", tmp_path / "configs").problems == []
    path = table_path(tmp_path / "configs", "sm_90", spec.name, shape, device="NVIDIA H200")
    (entry,) = read(path)["entries"]
    # the two readings pool under num_stages 1; export keeps the faster
    assert entry["config"] == {**gemv, "num_stages": 1} and entry["time_ms"] == pytest.approx(0.0074)
    assert [f for f in verify([tmp_path / "configs"], schema_only=True)[1] if f.level == "error"] == []


def test_w_tma_only_where_tma_can_address_the_weights():
    """W_TMA needs the tensor-core paths (check_config) and weight rows of a multiple of 16 bytes."""
    spec = get_spec("fp8_decode.gate_up")
    tile = {**spec.default, "ALGO": "grouped", "A_FP8": 2, "num_stages": 3, "W_TMA": 1}
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    assert spec.constraint(tile, spec.problem(shape, tokens=16), H200) is None
    odd = spec.problem({**shape, "K": 7160 + 4}, tokens=16)
    assert "W_TMA" in spec.constraint(tile, odd, H200)
    assert spec.constraint({**tile, "W_TMA": 0}, odd, H200) is None
    with pytest.raises(ValueError, match="W_TMA"):
        spec.check_config({**tile, "A_FP8": 0})


def test_sm90_skips_the_designs_the_h200_stores_show_never_win():
    """grouped A_FP8 0, PREFETCH 1 and A_FP8 1 are dominated on sm_90 only; they still pass the
    constraints (tables and explicit configs may use them) and --full-space plans them again.
    DeepSeek-V3 TP8 gate/up at 16 tokens: 10884 candidates -> 5028 and 1068 binaries."""
    from moetune.tuner.sweep import plan_point

    spec = get_spec("fp8_decode.gate_up")
    a100 = DeviceInfo("NVIDIA A100", "sm_80", 108, 166912, 40 << 20, True)
    for cfg in ({"ALGO": "grouped", "A_FP8": 0}, {"PREFETCH": 1}, {"A_FP8": 1},
                {"ALGO": "grouped", "A_FP8": 1}):
        full = {**spec.default, **cfg}
        assert spec.dominated(full, H200) and spec.dominated(full, a100) is None
    for cfg in ({}, {"ALGO": "grouped", "A_FP8": 2}, {"A_FP8": 2, "W_TMA": 1}):
        assert spec.dominated({**spec.default, **cfg}, H200) is None
    shape = spec.normalize_shape(spec.shape_from_model(get_model("deepseek-v3"), tp=8))
    problem = spec.problem(shape, tokens=16)
    searched = plan_point(spec, problem, H200)
    full = plan_point(spec, problem, H200, full_space=True)
    assert (len(searched.candidates), len(full.candidates)) == (5028, 10884)
    assert searched.pruned == full.pruned + 10884 - 5028
    assert len({spec.binary_key(c) for c in searched.candidates}) == 1068
    assert not any(spec.dominated(c, H200) for c in searched.candidates)
