"""Triton kernels with their launchers and pure-torch references, one module per kernel path."""
