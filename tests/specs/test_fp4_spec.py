"""The fp4_prefill.gate_up / .down kernel specs: shapes, constraints, heuristic, inputs, accuracy gate."""

import pytest

from moetune.device import INTERPRETER, DeviceInfo
from moetune.models import get_model
from moetune.specs.registry import get_spec

OPS = ("fp4_prefill.gate_up", "fp4_prefill.down")
H200 = DeviceInfo("NVIDIA H200", "sm_90", 132, 232448, 0, False)


def test_shapes_from_deepseek_v4_flash_tp2():
    m = get_model("deepseek-v4-flash")
    assert get_spec(OPS[0]).shape_from_model(m, tp=2) == {"E": 256, "N": 2048, "K": 4096, "top_k": 6}
    assert get_spec(OPS[1]).shape_from_model(m, tp=2) == {"E": 256, "N": 4096, "K": 1024, "top_k": 6}
    for op in OPS:
        spec = get_spec(op)
        assert spec.weight_format == "fp4"
        assert {k: spec.default[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
                                             "num_warps", "num_stages")} == {
            "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
            "num_warps": 8, "num_stages": 1}
        with pytest.raises(ValueError, match="K"):
            spec.normalize_shape({"E": 2, "N": 64, "K": 48, "top_k": 1})


def test_constraints():
    spec = get_spec(OPS[0])
    prob = spec.problem({"E": 8, "N": 256, "K": 256, "top_k": 2}, tokens=32)  # 8 rows per expert
    ok = dict(spec.default)
    assert spec.constraint(ok, prob, INTERPRETER) is None
    assert "BLOCK_SIZE_K" in spec.constraint(dict(ok, BLOCK_SIZE_K=512), prob, INTERPRETER)
    assert "BLOCK_SIZE_K" in spec.constraint(dict(ok, BLOCK_SIZE_K=96), prob, INTERPRETER)
    assert "BLOCK_SIZE_N" in spec.constraint(dict(ok, BLOCK_SIZE_N=512), prob, INTERPRETER)
    assert "rows per expert" in spec.constraint(dict(ok, BLOCK_SIZE_M=256), prob, INTERPRETER)
    assert "unknown" in spec.constraint(dict(ok, SPLIT_K=2), prob, INTERPRETER)
    small = DeviceInfo("tiny", "sm_80", 1, 48 * 1024, 0, True)
    assert "shared memory" in spec.constraint(dict(ok, BLOCK_SIZE_N=256, BLOCK_SIZE_K=256, num_stages=3),
                                              prob, small)
    assert sum(spec.constraint(c, prob, INTERPRETER) is None for c in spec.candidates()) > 100


def test_every_group_size_of_a_tile_runs_one_binary():
    """GROUP_SIZE_M only orders the programs, so the GEMM takes it at run time, unspecialized: DeepSeek-V4-
    Flash TP2 gate/up at 24576 routes needs 24800 binaries for its 74400 configs. Its sm_90 PTX (compiled
    here) differs from a constexpr group size by two multiplies and a min on registers."""
    from sm90_compile import param_flags

    kernel = "moetune.kernels.fp4_prefill.triton_gemm.fp4_moe_gemm_kernel"
    assert param_flags([kernel], "GROUP_SIZE_M") == [(False, True)]
    spec = get_spec("fp4_prefill.gate_up")
    tile = {**spec.default, "GROUP_SIZE_M": 1}
    assert spec.binary_key(tile) == spec.binary_key({**tile, "GROUP_SIZE_M": 16})
    assert spec.binary_key(tile) != spec.binary_key({**tile, "num_stages": 2})


def test_heuristic_tracks_density():
    for op in OPS:
        spec = get_spec(op)
        shape = {"E": 256, "N": 2048, "K": 4096, "top_k": 6}
        picks = [spec.heuristic(shape, r, "sm_89") for r in (1536, 6144, 24576)]
        assert [p["BLOCK_SIZE_M"] for p in picks] == [16, 32, 128]
        assert all(p["BLOCK_SIZE_K"] == 128 for p in picks)
        assert spec.heuristic(shape, 1536, "interpreter") == spec.default
        for p in picks:
            spec.check_config(p)


def test_hopper_heuristic_runs_gluon_where_the_shape_lets_it():
    """sm_90 shapes with K a multiple of 256: the Gluon tables' tiles at every density (the SWAP_AB 1 ring
    with RING_SPLIT up to 32 rows per expert, SWAP_AB 0 above, the warp-specialized 128-row tile from 65);
    down's resident tile only where its activations fit (K 1024, not 2048)."""
    m = get_model("deepseek-v4-flash")
    densities = (3, 6, 12, 24, 48, 96, 192, 384)
    for op in OPS:
        spec = get_spec(op)
        for tp in (2, 1):
            shape = spec.shape_from_model(m, tp=tp)
            picks = [spec.heuristic(shape, 256 * d, "sm_90") for d in densities]
            assert all(p["IMPL"] == "gluon" for p in picks), (op, tp)
            assert [p["BLOCK_SIZE_M"] for p in picks] == [16, 16, 16, 32, 64, 128, 128, 128]
            assert all(p["SWAP_AB"] == 1 and p["RING_SPLIT"] == 1 and p["SCALE_RING"] == 1 for p in picks[:4])
            assert all(p["SWAP_AB"] == 0 for p in picks[4:])
            assert all(p["DECODE_WARPS"] == 4 for p in picks[5:])
            resident = op.endswith("down") and tp == 2  # K 1024: 128 KiB of activations; 2048 needs 256
            assert [p["A_RESIDENT"] for p in picks[5:]] == [int(resident)] * 3, (op, tp)
            for d, p in zip(densities, picks, strict=True):
                prob = spec.problem(shape, tokens=256 * d // 6)
                assert spec.constraint(p, prob, H200) is None, (op, tp, d, p)
                spec.check_config(p)


class _Picked(Exception):
    """Raised by the stand-in picker once both GEMMs have asked."""


def test_gpt_oss_shapes_are_the_ones_the_padded_layer_asks_for(monkeypatch):
    """gpt-oss-120b (hidden and intermediate 2880): the spec plans each GEMM at K padded to a multiple of 256
    (TP1 3072 / 3072, TP2 3072 / 1536), the shape fp4_prefill_moe asks the picker for once the weights are
    zero-padded at load (pad_mxfp4_k), so a sweep of the model makes the tables the padded layer finds.
    Shapes whose K already is a multiple of 256 (DeepSeek-V4-Flash) are unchanged."""
    import torch

    import moetune.tables.picker as picker
    from moetune.kernels.fp4_prefill.config import padded_k
    from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe

    assert [padded_k(k) for k in (2880, 1440, 720, 1024, 4096, 256)] == [3072, 1536, 768, 1024, 4096, 256]
    m = get_model("gpt-oss-120b")
    for tp, inter in ((1, 2880), (2, 1440)):
        asked: dict = {}

        def pick(kernel, shape, routes, asked=asked, **_):
            asked[kernel] = dict(shape)
            if len(asked) == 2:
                raise _Picked
            return {}

        monkeypatch.setattr(picker, "pick_config", pick)
        k1, k2 = padded_k(m.hidden), padded_k(inter)

        def bank(n, k):  # packed codes and scales, zero-padded along K to k
            return (torch.empty(m.experts, n, k // 2, device="meta", dtype=torch.uint8),
                    torch.empty(m.experts, n, k // 32, device="meta", dtype=torch.uint8))

        args = (torch.empty(8, m.hidden, device="meta", dtype=torch.bfloat16), *bank(2 * inter, k1),
                *bank(m.hidden, k2), torch.empty(8, m.top_k, device="meta"),
                torch.empty(8, m.top_k, device="meta", dtype=torch.int32))
        with pytest.raises(_Picked):
            fp4_prefill_moe(*args, activation="swiglu", swiglu_limit=7.0)
        planned = {op: get_spec(op).shape_from_model(m, tp=tp) for op in OPS}
        assert asked == planned, tp
        assert planned[OPS[0]]["K"] == 3072 and planned[OPS[1]]["K"] == k2 and planned[OPS[1]]["N"] == 2880
    v4 = get_model("deepseek-v4-flash")
    assert [get_spec(op).shape_from_model(v4, tp=1)["K"] for op in OPS] == [v4.hidden, v4.intermediate]


def test_hopper_heuristic_names_gluon_tiles_only_with_whole_n_tiles():
    """gpt-oss-120b's padded shapes on sm_90: the heuristic names a Gluon tile only where N is whole tiles
    of it (a tail tile's speed is not measured; sweeps search it, checked first); TP1 gate/up (N 5760)
    runs Gluon in every band, as on V4-Flash; every pick passes the constraint."""
    m = get_model("gpt-oss-120b")
    densities = (6, 12, 24, 48, 96, 192, 384)
    for op in OPS:
        spec = get_spec(op)
        for tp in (1, 2, 4):
            shape = spec.shape_from_model(m, tp=tp)
            picks = [spec.heuristic(shape, 128 * d, "sm_90") for d in densities]
            for d, p in zip(densities, picks, strict=True):
                if p["IMPL"] == "gluon":
                    assert shape["N"] % p["BLOCK_SIZE_N"] == 0, (op, tp, d, p)
                prob = spec.problem(shape, tokens=128 * d // 4)
                assert spec.constraint(p, prob, H200) is None, (op, tp, d, p)
            if op.endswith("gate_up") and tp == 1:
                assert all(p["IMPL"] == "gluon" for p in picks)


def test_hopper_heuristic_follows_the_h200_winners():
    """sm_90 shapes Gluon cannot run (K not a multiple of 256): the M tile grows with rows per expert; fp8
    decode swapped, by lut, up to 32 rows; lut with SCALE_AHEAD and 8 warps at 96 rows; halves, or asm16 for
    gate/up at 48 rows, elsewhere."""
    densities = (3, 6, 12, 24, 48, 96, 192, 384)
    for op in OPS:
        spec = get_spec(op)
        shape = {"E": 256, "N": 2048, "K": 3968, "top_k": 6}
        picks = [spec.heuristic(shape, 256 * d, "sm_90") for d in densities]
        assert all(p["IMPL"] == "triton" for p in picks)
        assert [p["BLOCK_SIZE_M"] for p in picks] == [16, 16, 16, 32, 64, 128, 128, 128]
        assert all((p["DECODE"], p["UNPACK"], p["SWAP_AB"]) == ("fp8", "halves", 0) for p in picks[6:])
        assert (picks[5]["UNPACK"], picks[5]["SCALE_AHEAD"], picks[5]["num_warps"]) == ("lut", 1, 8)
        assert all((p["DECODE"], p["UNPACK"], p["SWAP_AB"]) == ("fp8", "lut", 1) for p in picks[:4])
        if op.endswith("gate_up"):
            assert (picks[4]["DECODE"], picks[4]["UNPACK"]) == ("fp8", "asm16")
        else:
            assert (picks[4]["DECODE"], picks[4]["UNPACK"], picks[4]["SWAP_AB"]) == ("fp8", "halves", 1)
        for d, p in zip(densities, picks, strict=True):
            prob = spec.problem(shape, tokens=256 * d // 6)
            assert spec.constraint(p, prob, H200) is None, (op, d, p)
            assert p != spec.default
        assert spec.default["DECODE"] == "bf16" and spec.default["BLOCK_SIZE_M"] == 64  # static unchanged


def test_hopper_heuristic_fits_small_shapes():
    """Measured tiles shrink to a small N/K; halves needs K tiles >= 64, so K 32 falls back to join."""
    for op in OPS:
        spec = get_spec(op)
        for shape in ({"E": 4, "N": 96, "K": 32, "top_k": 2}, {"E": 4, "N": 48, "K": 160, "top_k": 2}):
            for routes in (8, 96, 256, 1024):
                p = spec.heuristic(shape, routes, "sm_90")
                prob = spec.problem(shape, tokens=routes // 2)
                assert spec.constraint(p, prob, H200) is None, (op, shape, routes, p)
                assert p["BLOCK_SIZE_N"] <= 128 and p["BLOCK_SIZE_K"] <= shape["K"]
                if shape["K"] == 32:
                    assert p["UNPACK"] not in ("halves", "lut") and p["SWAP_AB"] == 0


@pytest.mark.parametrize("op", OPS)
def test_spec_run_passes_accuracy_gate_with_poisoned_outputs(op, device):
    spec = get_spec(op)
    prob = spec.problem({"E": 4, "N": 96, "K": 160, "top_k": 3}, tokens=10, active_fraction=2 / 3,
                        routing="zipf:1.5")
    inputs = spec.make_inputs(prob, device, seed=5)
    ref = spec.reference(inputs)
    cfgs = [dict(spec.default, BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, DECODE="fp8_scaled"),
            dict(spec.default, BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, DECODE="fp8")]
    for cfg in cfgs:
        spec.poison(inputs)
        spec.run(inputs, cfg)
        err = spec.error(inputs.outputs, ref)
        assert spec.passes(err), (cfg, err)
    assert set(inputs.extra["align"]) == {16, 32}  # aligned once per BLOCK_SIZE_M, cached
    assert spec.flops(prob, inputs) == 2 * 20 * 96 * 160
    assert spec.bytes_moved(prob, inputs) > 0 and spec.bytes_moved(prob) > 0
    # a run that skips rows is caught: the poisoned rows stay NaN
    spec.poison(inputs)
    assert not spec.passes(spec.error(inputs.outputs, ref))
    if op == "fp4_prefill.down":  # bf16 rows: written to their own buffer, widened by collect
        bf16 = dict(cfgs[1], OUT_DTYPE="bf16")
        spec.poison(inputs)
        spec.run(inputs, bf16)
        assert not spec.passes(spec.error(inputs.outputs, ref))  # not collected yet
        spec.collect(inputs, bf16)
        assert spec.passes(spec.error(inputs.outputs, ref))
        spec.poison(inputs)
        spec.collect(inputs, bf16)  # a poisoned bf16 buffer: caught as well
        assert not spec.passes(spec.error(inputs.outputs, ref))


def test_smem_estimate_bounds_what_triton_allocates():
    """Shared bytes Triton allocated for sm_90 (metadata.shared; the first on Triton 3.6, the rest 3.9)."""
    from moetune.kernels.fp4_prefill.config import normalize_config, smem_bytes

    h200 = DeviceInfo("h200", "sm_90", 132, 232448, 0, True)
    measured = [  # (DECODE, UNPACK, SWAP_AB, BM, BN, BK, stages, warps, bytes)
        ("bf16", "join", 0, 256, 128, 256, 1, 8, 393216), ("bf16", "halves", 1, 256, 128, 256, 2, 8, 476160),
        ("fp8", "asm16", 0, 128, 128, 128, 3, 8, 81920), ("fp8_row", "asm16", 0, 64, 128, 128, 2, 4, 41472),
        ("f16", "asm16", 0, 32, 128, 64, 2, 4, 22528), ("bf16", "halves", 1, 64, 64, 128, 3, 4, 45568),
        ("f16", "halves", 1, 128, 128, 128, 3, 8, 82944), ("fp8", "halves", 1, 256, 128, 128, 1, 8, 33792),
        ("fp8_row", "asm", 0, 256, 256, 128, 1, 8, 131072), ("f16", "asm", 1, 64, 64, 128, 1, 8, 32768),
        ("f16", "asm", 1, 256, 64, 128, 2, 8, 118784), ("fp8_row", "halves", 1, 16, 128, 128, 2, 4, 12800),
    ]
    spec = get_spec(OPS[0])
    prob = spec.problem({"E": 256, "N": 2048, "K": 4096, "top_k": 6}, tokens=4096)
    for dec, unpack, swap, bm, bn, bk, st, w, allocated in measured:
        cfg = normalize_config(dict(DECODE=dec, UNPACK=unpack, SWAP_AB=swap, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn,
                                    BLOCK_SIZE_K=bk, num_stages=st, num_warps=w))
        est = smem_bytes(cfg)
        assert allocated <= est <= max(2.5 * allocated, 64 * 1024), (cfg, allocated, est)
        assert (spec.constraint(cfg, prob, h200) is None) == (allocated <= 232448)


def test_new_design_switches_validate():
    spec = get_spec(OPS[1])
    prob = spec.problem({"E": 8, "N": 256, "K": 256, "top_k": 2}, tokens=32)
    with pytest.raises(ValueError, match="halves"):
        spec.check_config(dict(spec.default, UNPACK="halves", BLOCK_SIZE_K=32))
    with pytest.raises(ValueError, match="SWAP_AB"):
        spec.check_config(dict(spec.default, SWAP_AB=2))
    assert "fp8_scaled" in spec.constraint(dict(spec.default, DECODE="fp8_scaled", UNPACK="halves"), prob,
                                           INTERPRETER)
    assert spec.constraint(dict(spec.default, DECODE="fp8_row", UNPACK="halves", SWAP_AB=1), prob,
                           INTERPRETER) is None


def test_sm90_skips_the_fp4_decodes_the_h200_stores_show_never_win():
    from moetune.tuner.sweep import plan_point

    spec = get_spec("fp4_prefill.gate_up")
    a100 = DeviceInfo("NVIDIA A100", "sm_80", 108, 166912, 0, True)
    for decode in ("f16", "fp8_scaled"):
        cfg = {**spec.default, "DECODE": decode}
        assert "dominated" in spec.dominated(cfg, H200) and spec.dominated(cfg, a100) is None
    for decode in ("bf16", "fp8", "fp8_row"):
        assert spec.dominated({**spec.default, "DECODE": decode}, H200) is None
    problem = spec.problem({"E": 8, "N": 256, "K": 384, "top_k": 2}, 16)  # no Gluon kernel at K 384
    searched = plan_point(spec, problem, H200)
    full = plan_point(spec, problem, H200, full_space=True)
    assert {c["DECODE"] for c in searched.candidates} == {"bf16", "fp8", "fp8_row"}
    assert {c["DECODE"] for c in full.candidates} >= {"f16", "fp8_scaled"}


def test_sm90_searches_only_the_gluon_kernels_where_they_run():
    from moetune.tuner.sweep import plan_point

    spec = get_spec("fp4_prefill.down")
    a100 = DeviceInfo("NVIDIA A100", "sm_80", 108, 166912, 0, True)
    triton_cfg = {**spec.default, "IMPL": "triton"}
    assert "IMPL triton" in spec.dominated(triton_cfg, H200, {"K": 3072})
    assert spec.dominated(triton_cfg, H200, {"K": 2880}) is None  # unpadded: Triton's alone
    assert spec.dominated(triton_cfg, H200) is None and spec.dominated(triton_cfg, a100, {"K": 3072}) is None
    problem = spec.problem({"E": 8, "N": 256, "K": 512, "top_k": 2}, 16)
    searched = plan_point(spec, problem, H200)
    full = plan_point(spec, problem, H200, full_space=True)
    assert {c["IMPL"] for c in searched.candidates} == {"gluon"}
    assert {c["IMPL"] for c in full.candidates} == {"gluon", "triton"}


def test_candidates_are_the_valid_configs_of_the_full_product():
    """candidates() checks each switch combination once instead of every config: what it yields is the
    full product's configs that pass the config checks, each once (a reduced tile space, every switch)."""
    from moetune.kernels.fp4_prefill.config import _config_check
    from moetune.problem import canonical_json
    from moetune.specs.base import KernelSpec
    from moetune.specs.fp4_prefill import Fp4GateUpSpec

    spec = Fp4GateUpSpec()
    spec.space = {**spec.space, "BLOCK_SIZE_M": (16, 128), "BLOCK_SIZE_N": (32, 64), "GROUP_SIZE_M": (1,),
                  "num_warps": (4,), "num_stages": (1, 3)}
    full = {canonical_json(c) for c in KernelSpec.candidates(spec)
            if _config_check(spec.gemm, tuple(c.items()))[0] is None}
    got = [canonical_json(c) for c in spec.candidates()]
    assert len(got) == len(set(got)) and set(got) == full
    assert any('"A_QUADS":1' in c for c in got) and any('"SCALE_AHEAD":1' in c for c in got)
