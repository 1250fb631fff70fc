"""128x128 block FP8 quantizer: the weight_scale_inv convention, partial blocks, padded scales."""

import pytest
import torch

from moetune.quant.fp8_block import FP8_MAX, dequantize_fp8_block, quantize_fp8_block


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (3, 130, 129), (1, 7)])
def test_roundtrip_partial_blocks(shape, device):
    g = torch.Generator(device).manual_seed(0)
    w = (torch.randn(*shape, generator=g, device=device)
         * torch.rand(*shape[:-1], 1, generator=g, device=device) * 3)
    q, s = quantize_fp8_block(w)
    *lead, n, k = shape
    assert q.dtype == torch.float8_e4m3fn and tuple(q.shape) == shape
    assert s.dtype == torch.float32 and tuple(s.shape) == (*lead, -(-n // 128), -(-k // 128))
    back = dequantize_fp8_block(q, s)
    assert ((back - w).norm() / w.norm()).item() < 0.04  # e4m3 has a 3-bit mantissa
    # w ≈ w_fp8 * scale per block, and each block's max maps to the e4m3 max
    assert torch.allclose(q[..., :1, :1].float() * s[..., :1, :1], back[..., :1, :1])
    assert q.float().abs().amax().item() == FP8_MAX


def test_zero_block_scale_is_one_and_padded_scales_accepted(device):
    w = torch.zeros(130, 260, device=device)
    w[:128, :128] = torch.randn(128, 128, device=device)
    q, s = quantize_fp8_block(w)
    assert s[1, 1].item() == 1.0 and s[0, 0].item() > 0
    padded = torch.full((2, 5), float("nan"), device=device)
    padded[:, :3] = s
    assert torch.equal(dequantize_fp8_block(q, padded), dequantize_fp8_block(q, s))


def test_custom_block_and_errors(device):
    w = torch.randn(64, 96, device=device)
    q, s = quantize_fp8_block(w, block=(32, 64))
    assert s.shape == (2, 2)
    assert ((dequantize_fp8_block(q, s, block=(32, 64)) - w).norm() / w.norm()).item() < 0.04
    with pytest.raises(ValueError, match="block"):
        quantize_fp8_block(w, block=(0, 128))
    with pytest.raises(ValueError, match="w must"):
        quantize_fp8_block(torch.arange(10, device=device))
    with pytest.raises(ValueError, match="scale must"):
        dequantize_fp8_block(q, s[:1], block=(32, 64))
