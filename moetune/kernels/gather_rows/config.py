"""Config rules of the row gather: its space, default, checks and density heuristic.

The op has no weights, so its shape describes the activation: ``K`` is the row width in bytes (the
model's hidden size), ``N`` must equal ``K`` (kept only because every shape carries it; filled in
when omitted), and ``E``/``top_k`` are there so a table is keyed by density (rows per expert) like
the GEMMs it feeds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.device import DeviceInfo
from moetune.kernels.rules import TileRules
from moetune.problem import Config, Problem

GROUP = 128  # values per fp32 scale

SPACE: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_K": (128, 256, 512, 1024, 2048, 4096, 8192),
    "ROWS_PER_PROGRAM": (1, 2, 4, 8, 16),
    "num_warps": (1, 2, 4, 8),
}
# Measured on an H200 (docs/kernels/gather_rows.md): within 5% of the best listed config at every point
# there; 1024x1 tiles were 1.8x slower at 8192 rows (too few bytes in flight per program).
DEFAULT: Config = {"BLOCK_SIZE_K": 1024, "ROWS_PER_PROGRAM": 4, "num_warps": 4}
MAX_K_TILES = 65535  # CUDA grid limit of the K-tile axis


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def check_config(config: Mapping[str, Any]) -> Config:
    """The full config (defaults filled in); ValueError naming the key when it cannot run."""
    unknown = set(config) - set(DEFAULT)
    if unknown:
        raise ValueError(f"gather_rows: unknown config key(s) {sorted(unknown)}; known: {sorted(DEFAULT)}")
    full = {**DEFAULT, **config}
    for key, value in full.items():
        if not _pow2(value):
            raise ValueError(f"gather_rows: config {key} must be a power-of-two int, got {value!r}")
    if full["num_warps"] > 32:
        raise ValueError(f"gather_rows: config num_warps must be <= 32, got {full['num_warps']}")
    for key in ("BLOCK_SIZE_K", "ROWS_PER_PROGRAM"):  # an absurd tile fails here, not inside a launch
        if full[key] > max(SPACE[key]):
            raise ValueError(f"gather_rows: config {key} must be <= {max(SPACE[key])}, got {full[key]}")
    return full


def group_count(k: int) -> int:
    return -(-k // GROUP)


def shape(experts: int, hidden: int, top_k: int) -> dict[str, int]:
    """The gather's table shape for rows of ``hidden`` bytes feeding ``experts`` experts."""
    return {"E": experts, "N": hidden, "K": hidden, "top_k": top_k}


class GatherRowsRules(TileRules):
    name = "gather_rows"
    description = "gather quantized activation rows and their fp32 group scales in one launch"
    space = SPACE
    default = DEFAULT

    def normalize_shape(self, shape: Mapping[str, Any]) -> dict[str, Any]:
        shape = dict(shape)
        if "N" not in shape and "K" in shape:
            shape["N"] = shape["K"]
        out = super().normalize_shape(shape)
        if out["N"] != out["K"]:
            raise ValueError(f"gather_rows: shape field N must equal K (the row width), "
                             f"got N={out['N']} K={out['K']}")
        return out

    def check_config(self, config: Mapping[str, Any]) -> None:
        check_config(config)

    def constraint(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        why = super().constraint(config, problem, device)
        if why:
            return why
        k, bk, rows, warps = problem.shape["K"], config["BLOCK_SIZE_K"], config["ROWS_PER_PROGRAM"], \
            config["num_warps"]
        if -(-k // bk) > MAX_K_TILES:
            return f"BLOCK_SIZE_K {bk} gives more than {MAX_K_TILES} K tiles"
        if check_config(config) == DEFAULT:
            return None  # the baseline runs everywhere; the rules below only skip wasteful tiles
        if bk > min(SPACE["BLOCK_SIZE_K"]) and bk // 2 >= k:
            return f"BLOCK_SIZE_K {bk} is over twice K {k}: a half-width tile covers the row"
        if rows > 1 and rows // 2 >= max(problem.routes, 1):
            return f"ROWS_PER_PROGRAM {rows} is over twice the {problem.routes} rows"
        tile = rows * min(bk, 1 << max(k - 1, 0).bit_length())
        if tile < 32 * warps:
            return f"{warps} warps have more threads than the {tile}-byte tile has bytes"
        if rows * bk > 512 * 32 * warps:
            return f"a {rows}x{bk} tile is over 512 bytes per thread with {warps} warps"
        return None

    def heuristic(self, shape: Mapping[str, Any], routes: int, arch: str) -> Config:
        """About 4 KiB per program, 32 bytes per thread: what the H200 sweep favoured at 8192 rows
        (decode sizes sit at the launch floor with any tile, so they do not constrain it)."""
        k = shape["K"]
        bk = min(4096, max(128, 1 << max(k - 1, 0).bit_length()))
        rows = 1
        while rows < 16 and rows * 2 * bk <= 4096 and rows * 2 <= max(routes, 1):
            rows *= 2
        warps = min(4, max(1, rows * bk // 512))
        return {"BLOCK_SIZE_K": bk, "ROWS_PER_PROGRAM": rows, "num_warps": warps}


RULES = (GatherRowsRules(),)
