"""Config rules of the FP8 block-scale decode GEMMs: the tile space, the shipped default, the checks a
config must pass, the constraints at a point, and the density heuristic the picker falls back to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from moetune.device import DeviceInfo
from moetune.kernels.rules import TileRules
from moetune.problem import Config, Problem

SCALE_BLOCK = 128
ALGOS = ("route", "grouped")
GEMM_DEFAULT: dict[str, Any] = {
    "ALGO": "route", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128,
    "SPLIT_K": 1, "SWAP_AB": 0, "A_FP8": 0, "FUSE": 0, "PREFETCH": 0, "W_TMA": 0, "GEMV_STAGES": 1,
    "PERSISTENT": 0, "num_warps": 4, "num_stages": 1,
}
GEMMS = ("gate_up", "down")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_ROUTE_PROGRAMS = 512  # route path, long K: below this grid size, split K (H200: 4 splits at 1 token)
_SM90_PROGRAMS = 264  # the same on sm_90 with A_FP8 2 tiles (BN 64): two programs per H200 SM
_SM90_GEMV_ROWS = 4096  # sm_90, long K: output rows (routes x N) up to which one W8A16 GEMV launch wins


def _next_pow2(v: int) -> int:
    """triton.next_power_of_2 without its JIT-function call overhead (planning calls it ~10^6 times)."""
    return 1 << max(0, int(v) - 1).bit_length()


def gemm_shapes(experts: int, hidden: int, inter: int, top_k: int, dtype: str) -> dict[str, dict[str, Any]]:
    """Each GEMM's table shape for one rank: gate/up [2*inter, hidden], down [hidden, inter]."""
    return {"gate_up": {"E": experts, "N": 2 * inter, "K": hidden, "top_k": top_k, "dtype": dtype},
            "down": {"E": experts, "N": hidden, "K": inter, "top_k": top_k, "dtype": dtype}}


def _pow2(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def _plain_gemv(cfg: Mapping[str, Any]) -> bool:
    """The route GEMV without tensor cores, prefetch or fusion: the one GEMV_STAGES pipelines."""
    return cfg["ALGO"] == "route" and cfg["A_FP8"] == 0 and cfg["PREFETCH"] == 0 and cfg["FUSE"] == 0


def check_gemm_config(config: Mapping[str, Any], where: str = "config") -> dict[str, Any]:
    """The full config (defaults filled in) for one GEMM; ValueError naming the key otherwise."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{where} must be a mapping of tile parameters, got {type(config).__name__}")
    unknown = set(config) - set(GEMM_DEFAULT)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(GEMM_DEFAULT)}")
    cfg = {**GEMM_DEFAULT, **config}
    if cfg["ALGO"] not in ALGOS:
        raise ValueError(f"{where}['ALGO'] must be one of {ALGOS}, got {cfg['ALGO']!r}")
    bn_max = 128 if cfg["ALGO"] == "route" else 256
    checks = (
        ("BLOCK_SIZE_M", _pow2(cfg["BLOCK_SIZE_M"]) and 16 <= cfg["BLOCK_SIZE_M"] <= 256,
         "a power of two in [16, 256]"),
        ("BLOCK_SIZE_N", _pow2(cfg["BLOCK_SIZE_N"]) and 16 <= cfg["BLOCK_SIZE_N"] <= bn_max,
         f"a power of two in [16, {bn_max}] for ALGO {cfg['ALGO']!r}"),
        ("BLOCK_SIZE_K", _pow2(cfg["BLOCK_SIZE_K"]) and SCALE_BLOCK <= cfg["BLOCK_SIZE_K"] <= 1024,
         f"a power-of-two multiple of the {SCALE_BLOCK} scale block, at most 1024"),
        ("SPLIT_K", isinstance(cfg["SPLIT_K"], int) and not isinstance(cfg["SPLIT_K"], bool)
         and 1 <= cfg["SPLIT_K"] <= 64, "an int in [1, 64]"),
        ("SWAP_AB", cfg["SWAP_AB"] in (0, 1) and (cfg["SWAP_AB"] == 0 or cfg["ALGO"] == "grouped"),
         "0 or 1 (1 only for ALGO 'grouped')"),
        ("A_FP8", cfg["A_FP8"] in (0, 1, 2) and not isinstance(cfg["A_FP8"], bool),
         "0, 1 or 2 (0 W8A16, 1 activations split in-kernel, 2 split once before the GEMM)"),
        ("PREFETCH", cfg["PREFETCH"] in (0, 1) and not isinstance(cfg["PREFETCH"], bool)
         and (cfg["PREFETCH"] == 0 or (cfg["ALGO"] == "route" and cfg["A_FP8"] == 0 and cfg["FUSE"] == 0
                                       and cfg["BLOCK_SIZE_K"] == SCALE_BLOCK)),
         "0 or 1 (1 only for the W8A16 GEMV: ALGO 'route', A_FP8 0, FUSE 0, BLOCK_SIZE_K 128)"),
        ("W_TMA", cfg["W_TMA"] in (0, 1) and not isinstance(cfg["W_TMA"], bool)
         and (cfg["W_TMA"] == 0 or cfg["A_FP8"] in (1, 2)),
         "0 or 1 (1 only with A_FP8 1 or 2: the tensor-core paths)"),
        ("GEMV_STAGES", isinstance(cfg["GEMV_STAGES"], int) and not isinstance(cfg["GEMV_STAGES"], bool)
         and 1 <= cfg["GEMV_STAGES"] <= 4 and (cfg["GEMV_STAGES"] == 1 or _plain_gemv(cfg)),
         "an int in [1, 4] (over 1 only for the W8A16 GEMV: ALGO 'route', A_FP8 0, PREFETCH 0, FUSE 0)"),
        ("FUSE", cfg["FUSE"] in (0, 1) and not isinstance(cfg["FUSE"], bool)
         and (cfg["FUSE"] == 0 or (cfg["ALGO"] == "route" and cfg["SPLIT_K"] == 1 and cfg["A_FP8"] == 0)),
         "0 or 1 (1 only for ALGO 'route' with SPLIT_K 1 and A_FP8 0)"),
        ("PERSISTENT", isinstance(cfg["PERSISTENT"], int) and not isinstance(cfg["PERSISTENT"], bool)
         and 0 <= cfg["PERSISTENT"] <= 32 and (cfg["PERSISTENT"] == 0 or cfg["FUSE"] == 0),
         "an int in [0, 32] (programs per SM looping over the active tiles; 0: one program per tile; "
         "0 with FUSE 1)"),
        ("num_warps", _pow2(cfg["num_warps"]) and cfg["num_warps"] <= 16, "a power of two in [1, 16]"),
        ("num_stages", isinstance(cfg["num_stages"], int) and not isinstance(cfg["num_stages"], bool)
         and 1 <= cfg["num_stages"] <= 8, "an int in [1, 8]"),
    )
    for key, ok, expected in checks:
        if not ok:
            raise ValueError(f"{where}[{key!r}] must be {expected}, got {cfg[key]!r}")
    return cfg


class Fp8DecodeRules(TileRules):
    """Rules of one of the two GEMMs (``gemm``: "gate_up" or "down")."""

    gemm = ""
    space = {
        "ALGO": list(ALGOS),
        "BLOCK_SIZE_M": [16, 32, 64],
        "BLOCK_SIZE_N": [16, 32, 64, 128, 256],
        "BLOCK_SIZE_K": [128, 256, 512],
        "SPLIT_K": [1, 2, 4, 8, 16],
        "SWAP_AB": [0, 1],
        "A_FP8": [0, 1, 2],
        "PREFETCH": [0, 1],
        "W_TMA": [0, 1],
        "GEMV_STAGES": [1, 2, 3, 4],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3, 4],
    }
    default = dict(GEMM_DEFAULT)
    shape_defaults = {"dtype": "bfloat16"}

    def normalize_shape(self, shape: Mapping[str, Any]) -> dict[str, Any]:
        out = super().normalize_shape(shape)
        if out["dtype"] not in DTYPES:
            raise ValueError(f"{self.name}: shape field dtype must be one of {sorted(DTYPES)}, "
                             f"got {out['dtype']!r}")
        if out["top_k"] > out["E"]:
            raise ValueError(f"{self.name}: top_k {out['top_k']} exceeds E {out['E']}")
        return out

    def check_config(self, config: Mapping[str, Any]) -> None:
        super().check_config(config)
        check_gemm_config(config, self.name)

    def _bm_bound(self, problem: Problem) -> int:
        """The largest BLOCK_SIZE_M worth a candidate for the tl.dot algorithms: the routes rounded up to
        a power of two and, with uniform routing, 8x the routes per expert rounded up (at least 16).
        Larger M blocks are mostly padding: in the H200 sweeps they came near a point's best only at
        several routes per expert (docs/kernels/fp8_decode.md, BLOCK_SIZE_M)."""
        bound = max(16, _next_pow2(problem.routes))
        if problem.routing == "uniform":
            bound = min(bound, max(16, 8 * _next_pow2(-(-problem.routes // problem.shape["E"]))))
        return min(max(self.space["BLOCK_SIZE_M"]), bound)

    def constraint(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        reason = super().constraint(config, problem, device)
        if reason:
            return reason
        cfg = {**GEMM_DEFAULT, **config}
        n, k = problem.shape["N"], problem.shape["K"]
        bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        if cfg["FUSE"]:
            return "FUSE is a layer option (activation / top_k sum fused in), not a GEMM config"
        if cfg["ALGO"] == "route" and bm != GEMM_DEFAULT["BLOCK_SIZE_M"]:
            return "BLOCK_SIZE_M only matters for the tl.dot algorithms (route keeps the default)"
        if cfg["ALGO"] == "route" and not cfg["A_FP8"] and cfg["num_stages"] != 1:
            # the kernel's num_stages pipelines only the loads that feed tl.dot: 3.6 and 3.9 build the
            # same sm_90 binary for every value here (tests/specs/test_fp8_specs.py compiles them);
            # the GEMV's own pipeline depth is GEMV_STAGES
            return "num_stages does not change the W8A16 GEMV (GEMV_STAGES does); it keeps 1"
        if cfg["W_TMA"] and k % 16:  # its row stride, in fp8 bytes
            return f"W_TMA: TMA needs 16-byte aligned weight rows, K {k} is not a multiple of 16"
        if bn > max(16, _next_pow2(n)):
            return f"BLOCK_SIZE_N {bn} is wider than N {n}"
        if bk > max(128, _next_pow2(k)):
            return f"BLOCK_SIZE_K {bk} is longer than K {k}"
        k_blocks = -(-k // bk)  # not triton.cdiv: a JIT-function call per candidate slows planning
        if cfg["SPLIT_K"] > k_blocks:
            return f"SPLIT_K {cfg['SPLIT_K']} exceeds the {k_blocks} K blocks"
        if cfg["ALGO"] != "route" and bm > self._bm_bound(problem):
            return (f"BLOCK_SIZE_M {bm} is over {self._bm_bound(problem)} for {problem.routes} routes on "
                    f"{problem.shape['E']} experts (M blocks of mostly padding)")
        a_bytes = DTYPES[problem.shape["dtype"]].itemsize
        if cfg["A_FP8"] == 2:  # pre-split activations: two fp8 terms and the fp8 weights per stage, no
            # converted operand; route runs one-route tl.dot blocks of 16 rows
            smem = cfg["num_stages"] * (2 * (16 if cfg["ALGO"] == "route" else bm) * bk + bk * bn)
        elif _plain_gemv(cfg):  # GEMV_STAGES - 1 weight and activation tiles staged ahead (sm_90, 3.6)
            smem = (cfg["GEMV_STAGES"] - 1) * (bn * bk + bk * a_bytes)
        elif cfg["ALGO"] == "route":  # weight tile per stage, and with A_FP8 1 the 16-row activation tile
            # it splits (BN128 BK512 at 3 stages goes over sm_90's limit)
            smem = cfg["num_stages"] * (bn * bk + (16 * bk * a_bytes if cfg["A_FP8"] == 1 else 0))
        else:  # activation + fp8 weight tiles per stage, plus the converted operand
            smem = cfg["num_stages"] * (bm * bk * a_bytes + bk * bn) + 128 * bn * a_bytes
        if smem > device.max_shared_mem:
            return f"shared memory estimate {smem} B exceeds the device's {device.max_shared_mem} B"
        return None

    def heuristic(self, shape: Mapping[str, Any], routes: int, arch: str) -> Config:
        """The picker's fallback where no table covers a point; the tiles come from the H200 sweeps
        (docs/kernels/fp8_decode.md, heuristic).

        - Interpreter: the fewest programs (it pays per program).
        - sm_90, long K (>= 2048): one W8A16 GEMV launch while routes x N stays within
          ``_SM90_GEMV_ROWS``, where the launch is a large share of the time; up to one route per expert,
          the one-route tl.dot on pre-split activations (A_FP8 2) with split-K only until the grid has
          about two programs per SM; above, grouped SWAP_AB with A_FP8 2.
        - sm_90, short K: grouped SWAP_AB with A_FP8 2 above a quarter route per expert; below, the
          rules of the other archs.
        - Other archs (the sm_90 rules rest on H200 sweeps, and fp8 tensor-core dots need sm_89+): the
          GEMV ("route") up to one route per expert, where most experts get one route, so grouping saves
          few weight reads and its routing launch costs more; split-K only where the grid would be
          small. Above, "grouped" shares each expert's weight reads across its routes."""
        n, k, e = shape["N"], shape["K"], shape["E"]
        if arch == "interpreter":  # fewest programs: the interpreter pays per program
            return {**GEMM_DEFAULT, "BLOCK_SIZE_N": min(128, max(16, _next_pow2(n))),
                    "BLOCK_SIZE_K": 256 if k > 128 else 128}
        long_k = k >= 2048
        if arch == "sm_90":
            if long_k and routes * n <= _SM90_GEMV_ROWS:
                # one launch, no activation split: where the launch is a large share of the time
                return {**GEMM_DEFAULT, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 512, "SPLIT_K": 4,
                        "num_warps": 8}
            if long_k and routes <= e:
                split = 1  # enough programs for two waves on 132 SMs, no more: a split re-reads nothing
                while split < 8 and routes * -(-n // 64) * split < _SM90_PROGRAMS \
                        and 2 * split * 128 <= k:
                    split *= 2
                return {**GEMM_DEFAULT, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "SPLIT_K": split,
                        "A_FP8": 2, "num_stages": 4 if split <= 2 else 3}
            if long_k:
                return {**GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64,
                        "BLOCK_SIZE_K": 256, "SWAP_AB": 1, "A_FP8": 2, "num_stages": 3}
            if 4 * routes > e:
                return {**GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128,
                        "BLOCK_SIZE_K": 128, "SWAP_AB": 1, "A_FP8": 2, "num_stages": 3}
        if routes <= e:
            bk, split = (256 if k > 128 else 128), 1
            if long_k:
                split = max(1, min(4, _ROUTE_PROGRAMS // (max(1, routes) * -(-n // 128))))
                bk = 512 if split > 1 and k >= 4096 else bk
            split = min(split, -(-k // bk))
            return {**GEMM_DEFAULT, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": bk, "SPLIT_K": split,
                    "num_warps": 8}
        return {**GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 256 if long_k else 128, "SPLIT_K": 2 if long_k else 1, "num_stages": 3}


class GateUpRules(Fp8DecodeRules):
    name = "fp8_decode.gate_up"
    gemm = "gate_up"


class DownRules(Fp8DecodeRules):
    name = "fp8_decode.down"
    gemm = "down"


RULES = (GateUpRules(), DownRules())
