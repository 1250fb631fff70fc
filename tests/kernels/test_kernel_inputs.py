"""What the three ops refuse up front, with a ValueError naming the argument or config key: arguments
that are not tensors, a swiglu_limit that is not a positive finite number, absurd power-of-two tiles."""

import math

import pytest
import torch
from conftest import DEVICE

from moetune.kernels.fp4_prefill.config import normalize_config
from moetune.kernels.fp4_prefill.layer import fp4_prefill_moe
from moetune.kernels.fp8_decode.config import check_gemm_config
from moetune.kernels.fp8_decode.layer import fp8_decode_moe
from moetune.kernels.gather_rows.config import check_config as check_gather_config
from moetune.kernels.gather_rows.gather import gather_rows_with_scales
from moetune.quant import quantize_fp8_block, quantize_mxfp4
from moetune.routing import make_routes

HUGE = 2**40


def _fp8_layer(m=2, h=128, i=128, e=2, top_k=2):
    g = torch.Generator(DEVICE).manual_seed(0)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(torch.bfloat16)
    w13, s13 = quantize_fp8_block(torch.randn(e, 2 * i, h, generator=g, device=DEVICE) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(e, h, i, generator=g, device=DEVICE) * 0.05)
    ids, wts = make_routes(m, top_k, e, generator=g, device=DEVICE)
    return [x, w13, s13, w2, s2, wts, ids]


def _fp4_layer(m=2, h=64, i=32, e=2, top_k=2):
    g = torch.Generator(DEVICE).manual_seed(0)
    x = torch.randn(m, h, generator=g, device=DEVICE).to(torch.bfloat16)
    w13 = quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g, device=DEVICE) * 0.05)
    w2 = quantize_mxfp4(torch.randn(e, h, i, generator=g, device=DEVICE) * 0.05)
    ids, wts = make_routes(m, top_k, e, generator=g, device=DEVICE)
    return [x, *w13, *w2, wts, ids]


FP8_NAMES = ("x", "w13", "w13_scale", "w2", "w2_scale", "topk_weights", "topk_ids")
FP4_NAMES = ("x", "w13_packed", "w13_scale", "w2_packed", "w2_scale", "topk_weights", "topk_ids")


@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_decode_names_an_argument_that_is_not_a_tensor(name):
    args = dict(zip(FP8_NAMES, _fp8_layer(), strict=True))
    args[name] = args[name].tolist()
    with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor, got list"):
        fp8_decode_moe(**args)


@pytest.mark.parametrize("name", FP4_NAMES)
def test_fp4_prefill_names_an_argument_that_is_not_a_tensor(name):
    args = dict(zip(FP4_NAMES, _fp4_layer(), strict=True))
    args[name] = args[name].tolist()
    with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor, got list"):
        fp4_prefill_moe(**args)


@pytest.mark.parametrize("name", ["q", "scales", "dst2src"])
def test_gather_rows_names_an_argument_that_is_not_a_tensor(name, device):
    q = torch.zeros(4, 128, dtype=torch.uint8, device=device)
    args = {"q": q, "scales": torch.ones(4, 1, device=device), "dst2src": torch.arange(4, device=device)}
    args[name] = args[name].tolist()
    with pytest.raises(ValueError, match=f"^{name} must be a torch.Tensor, got list"):
        gather_rows_with_scales(**args)


@pytest.mark.parametrize("limit", [-1.0, 0.0, math.nan, math.inf, "7"])
def test_fp4_prefill_refuses_a_swiglu_limit_the_fp8_path_refuses(limit):
    with pytest.raises(ValueError, match="swiglu_limit must be None or a positive finite number"):
        fp4_prefill_moe(*_fp4_layer(), swiglu_limit=limit)
    with pytest.raises(ValueError, match="swiglu_limit must be None or a positive finite number"):
        fp8_decode_moe(*_fp8_layer(), activation="swiglu", swiglu_limit=limit)


@pytest.mark.parametrize("key", ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
                                 "num_stages"])
def test_fp4_prefill_config_check_refuses_absurd_tiles(key):
    with pytest.raises(ValueError, match=f"config {key} must be"):
        normalize_config({key: HUGE})
    with pytest.raises(ValueError, match=key):  # the layer refuses it before any launch
        fp4_prefill_moe(*_fp4_layer(), config={"gate_up": {key: HUGE}, "down": {}})


@pytest.mark.parametrize("key", ["BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps"])
def test_fp8_decode_config_check_refuses_absurd_tiles(key):
    with pytest.raises(ValueError, match=key):
        check_gemm_config({key: HUGE})


@pytest.mark.parametrize("key", ["BLOCK_SIZE_K", "ROWS_PER_PROGRAM", "num_warps"])
def test_gather_rows_config_check_refuses_absurd_tiles(key):
    with pytest.raises(ValueError, match=f"config {key} must be"):
        check_gather_config({key: HUGE})
