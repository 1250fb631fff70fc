"""FP8 block-scale MoE decode path; ``layer.fp8_decode_moe`` is the entry point and its module docstring maps
the package."""
