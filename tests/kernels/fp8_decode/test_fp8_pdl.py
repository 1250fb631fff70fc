"""Programmatic dependent launch for the FP8 decode layer: the sm_90 kernels carry the grid-dependency
instructions only when asked (compiled without a GPU), and the interpreter, which has no concurrent
kernels, gives the same layer output either way."""

import pytest
import torch
from test_fp8_decode import make_layer

from moetune import fp8_decode_moe

F = "moetune.kernels.fp8_decode."
BF, F8, F32, I32 = "*bf16", "*fp8e4nv", "*fp32", "*i32"
KERNELS = {  # kernel (module.name): (pointer and float argument types, constexprs)
    "gemm._route_gemm_kernel": (
        {"a_ptr": BF, "w_ptr": F8, "s_ptr": F32, "ids_ptr": I32, "rw_ptr": F32, "out_ptr": F32},
        {"APPLY_WEIGHT": False, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "A_ROW_DIV": 8, "GEMV_STAGES": 1,
         "FILL_INACTIVE": False, "PERSISTENT": True, "R_P2": 64}),
    "gemm._grouped_gemm_kernel": (
        {"a_ptr": F8, "lo_ptr": F8, "sa_ptr": F32, "w_ptr": F8, "s_ptr": F32, "ids_ptr": I32,
         "sorted_ptr": I32, "block_expert_ptr": I32, "used_ptr": I32, "rw_ptr": F32, "out_ptr": F32},
        {"APPLY_WEIGHT": True, "A_ROW_DIV": 1, "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
         "SWAP_AB": True, "DOT_FP32": False, "A_FP8": 2, "W_TMA": False, "FILL_INACTIVE": False,
         "PERSISTENT": True}),
    "split._split_rows_kernel": ({"a_ptr": BF, "hi_ptr": F8, "lo_ptr": F8, "sa_ptr": F32}, {"CHUNKS": 8}),
    "align._align_sort_kernel": (
        {"ids_ptr": I32, "sorted_ptr": I32, "block_expert_ptr": I32, "used_ptr": I32, "shift_ptr": I32},
        {"BLOCK_SIZE_M": 16, "R_P2": 64, "BINS": 512, "FILL": 1024}),
    "epilogue._gated_act_kernel": (
        {"gu_ptr": F32, "out_ptr": BF, "ids_ptr": I32, "hi_ptr": F8, "lo_ptr": F8, "sa_ptr": F32,
         "limit": "fp32"},
        {"SPLITS": 2, "ACTIVATION": 0, "HAS_LIMIT": False, "BLOCK": 256, "SPLIT_OUT": True,
         "FILL_INACTIVE": False}),
    "epilogue._sum_topk_kernel": (
        {"y_ptr": F32, "ids_ptr": I32, "out_ptr": BF}, {"SPLITS": 1, "BLOCK": 1024}),
}


def test_sm90_kernels_wait_for_the_previous_grid_only_with_pdl():
    from sm90_compile import compile_sm90

    jobs = [{"kernel": F + name, "types": types, "const": {**const, "PDL": pdl},
             "options": {"num_warps": 4, "num_stages": 1, "launch_pdl": pdl}}
            for name, (types, const) in KERNELS.items() for pdl in (True, False)]
    got = compile_sm90(jobs)
    if isinstance(got, str):
        pytest.skip(f"cannot compile for sm_90 here: {got}")
    for job, res in zip(jobs, got, strict=True):
        wanted = job["const"]["PDL"]
        assert ("griddepcontrol.wait" in res["ptx"]) == wanted, job["kernel"]
        assert ("griddepcontrol.launch_dependents" in res["ptx"]) == wanted, job["kernel"]


@pytest.mark.interpreter  # on the GPU pdl=True really overlaps the launches
@pytest.mark.parametrize("config", [None, {"gate_up": {"ALGO": "grouped", "BLOCK_SIZE_N": 128, "A_FP8": 2},
                                           "down": {"ALGO": "route", "BLOCK_SIZE_N": 64, "SPLIT_K": 2}}],
                         ids=["picked", "grouped-split"])
def test_the_interpreter_ignores_pdl(config):
    layer = make_layer(M=3, active=0.75)
    plain = fp8_decode_moe(*layer, config=config, pdl=False)
    assert torch.equal(fp8_decode_moe(*layer, config=config, pdl=True), plain)
    assert torch.equal(fp8_decode_moe(*layer, config=config), plain)  # None: on for sm_90+, off here


def test_pdl_must_be_a_bool_or_none():
    with pytest.raises(ValueError, match="pdl"):
        fp8_decode_moe(*make_layer(M=1), pdl="yes")
