"""Quantizers for the formats the kernels consume (pure torch, any device)."""

from moetune.quant.fp8_act import quantize_fp8_act
from moetune.quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from moetune.quant.mxfp4 import dequantize_mxfp4, pad_mxfp4_k, quantize_mxfp4, scale_row_max

__all__ = [
    "quantize_fp8_block", "dequantize_fp8_block",
    "quantize_mxfp4", "dequantize_mxfp4", "pad_mxfp4_k", "scale_row_max",
    "quantize_fp8_act",
]
