"""Pure-torch references of the shipped kernel paths (fp32 math on the dequantized weights).

Each lives next to its kernel; this module gathers them under one name.
"""

from __future__ import annotations

from moetune.kernels.fp4_prefill.reference import fp4_prefill_moe_reference as fp4_prefill_moe
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference as fp8_decode_moe
from moetune.kernels.gather_rows.gather import gather_rows_with_scales_reference as gather_rows_with_scales

__all__ = ["fp8_decode_moe", "fp4_prefill_moe", "gather_rows_with_scales"]
