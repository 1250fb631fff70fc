"""MXFP4 and per-128 FP8 activation quantizers: exact decode, packing order, error bounds."""

import math

import pytest
import torch

from moetune.quant import dequantize_mxfp4, quantize_fp8_act, quantize_mxfp4
from moetune.quant.fp8_act import dequantize_fp8_act
from moetune.quant.mxfp4 import E2M1_VALUES


def _pack(codes: torch.Tensor) -> torch.Tensor:
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def test_all_16_codes_decode_exactly():
    codes = torch.arange(32) % 16  # two blocks' worth in one row
    scale = torch.full((1, 1), 127, dtype=torch.uint8)
    got = dequantize_mxfp4(_pack(codes[None]), scale)[0]
    want = [(-1.0 if c & 8 else 1.0) * E2M1_VALUES[c & 7] for c in codes.tolist()]
    assert got.tolist() == want


def test_scale_codes_across_usable_range_decode_exactly():
    codes = torch.arange(32) % 16
    scales = torch.arange(0, 253, dtype=torch.uint8)  # above 252, 6 * 2^(s-127) overflows fp32; 255 is NaN
    packed = _pack(codes.repeat(scales.numel(), 1))
    got = dequantize_mxfp4(packed, scales[:, None])
    for i, s in enumerate(scales.tolist()):
        want = [math.ldexp((-1.0 if c & 8 else 1.0) * E2M1_VALUES[c & 7], s - 127) for c in codes.tolist()]
        assert got[i].tolist() == want, f"scale code {s}"


def test_packing_order_low_nibble_is_even_k():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1] = 6.0, -0.5  # codes 7 and 9 (sign | magnitude code 1)
    packed, scale = quantize_mxfp4(w)
    assert scale.item() == 127
    assert packed[0, 0].item() == 0x97


def test_quantize_dequantize_error_bounds():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 48, 256, generator=g) * torch.logspace(-6, 2, 48)[None, :, None]
    packed, scale = quantize_mxfp4(w)
    assert packed.shape == (3, 48, 128) and scale.shape == (3, 48, 8)
    dq = dequantize_mxfp4(packed, scale)
    step = torch.exp2(scale.float() - 127).repeat_interleave(32, dim=-1)
    err = (dq - w).abs()
    # E2M1 spacing is 0.5 below 2, 1 below 4 and 2 above: the rounding error is half of it.
    half_gap = torch.where(w.abs() < 2 * step, 0.25, torch.where(w.abs() < 4 * step, 0.5, 1.0)) * step
    assert (err <= half_gap * (1 + 1e-6)).all()
    # The scale is the smallest power of two that fits the block's largest magnitude under 6.
    amax = w.abs().reshape(3, 48, 8, 32).amax(-1)
    s = torch.exp2(scale.float() - 127)
    assert (amax <= 6 * s).all() and (amax > 3 * s).all()
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(dq)), dq)


def test_quantize_mxfp4_rounds_half_to_even_and_saturates():
    w = torch.zeros(1, 32)
    w[0, :5] = torch.tensor([6.0, 0.25, 0.75, 2.5, 5.0])
    dq = dequantize_mxfp4(*quantize_mxfp4(w))
    assert dq[0, :5].tolist() == [6.0, 0.0, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("bad", [torch.zeros(4, 40), torch.zeros(32), torch.zeros(2, 32, dtype=torch.int32),
                                 torch.full((1, 32), float("nan"))])
def test_quantize_mxfp4_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        quantize_mxfp4(bad)


def test_dequantize_mxfp4_rejects_mismatched_scale():
    with pytest.raises(ValueError, match="scale"):
        dequantize_mxfp4(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))


def test_fp8_act_scales_are_the_specified_powers_of_two():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 300, generator=g) * torch.tensor([1e-7, 1e-3, 1, 448, 1e3, 7])[:, None]
    x[2, :128] = 0.0
    x[3, 0] = 448.0 * 4  # an exact power-of-two multiple of 448 must not round up
    q, s = quantize_fp8_act(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and s.shape == (6, 3)
    groups = torch.nn.functional.pad(x, (0, 84)).reshape(6, 3, 128).abs().amax(-1)
    for (i, j), amax in zip(torch.cartesian_prod(torch.arange(6), torch.arange(3)).tolist(),
                            groups.flatten().tolist(), strict=True):
        want = 2.0 ** math.ceil(math.log2(max(amax, 1e-4) / 448))
        assert s[i, j].item() == want
    assert s[3, 0].item() == 4.0
    dq = dequantize_fp8_act(q, s)
    # e4m3 keeps 3 mantissa bits: relative rounding <= 2^-4 for normals, plus the subnormal floor.
    bound = x.abs() * 2**-4 + s.repeat_interleave(128, -1)[:, :300] * 2**-10
    assert ((dq - x).abs() <= bound).all()


def test_fp8_act_rejects_bad_input():
    with pytest.raises(ValueError, match="x"):
        quantize_fp8_act(torch.zeros(3, 4, 5))
