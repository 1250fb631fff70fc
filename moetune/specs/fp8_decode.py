"""Specs of the FP8 block-scale decode GEMMs: ``fp8_decode.gate_up`` and ``fp8_decode.down``.

Both run ``moetune.kernels.fp8_decode.fp8_block_gemm``; the algorithm ("route" GEMV with
split-K, "grouped" tensor-core blocks per expert) and the operand precision (A_FP8: two-term fp8
activations on fp8 tensor cores, split in-kernel (1) or by one launch before the GEMM (2), which the
timing includes) are tuned parameters like the tiles, because the best ones move
with route density. FUSE is a layer option (it changes what the GEMM writes), timed by
``benchmarks/fp8_decode.py``, not here. A grouped run includes its on-GPU
routing step (``align_routes``), which a layer pays once for both GEMMs; a split-K run includes
the sum of its partials, which the layer folds into the next kernel instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import triton

from ..device import DeviceInfo
from ..kernels import fp8_decode as F
from ..models import ModelPreset
from ..quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from ..routing import make_routes
from ..spec import Config, Inputs, KernelSpec, Problem, canonical_json, fewer_experts, register
from ._routed_reference import routed_matmul

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_ROUTE_PROGRAMS = 512  # route path, long K: below this grid size, split K (H200: 4 splits at 1 token)
_SM90_PROGRAMS = 264  # the same on sm_90 with A_FP8 2 tiles (BN 64): two programs per H200 SM
_SM90_GEMV_ROWS = 4096  # sm_90, long K: output rows (routes x N) up to which one W8A16 GEMV launch wins

_WEIGHT_CHUNK_BYTES = 1 << 30  # DeepSeek-V3 at TP 1 draws 30 GB of fp32 gate/up weights otherwise


def _next_pow2(v: int) -> int:
    """triton.next_power_of_2 without its JIT-function call overhead (planning calls it ~10^6 times)."""
    return 1 << max(0, int(v) - 1).bit_length()


class _Fp8DecodeGemm(KernelSpec):
    gemm = ""
    space = {
        "ALGO": list(F.ALGOS),
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
    default = dict(F.GEMM_DEFAULT)
    shape_defaults = {"dtype": "bfloat16"}
    tolerance = 1e-2
    cuda_graph = True
    weight_format = "fp8_block"

    # ---- shapes -------------------------------------------------------------------------------
    def normalize_shape(self, shape: Mapping[str, Any]) -> dict[str, Any]:
        out = super().normalize_shape(shape)
        if out["dtype"] not in DTYPES:
            raise ValueError(f"{self.name}: shape field dtype must be one of {sorted(DTYPES)}, "
                             f"got {out['dtype']!r}")
        if out["top_k"] > out["E"]:
            raise ValueError(f"{self.name}: top_k {out['top_k']} exceeds E {out['E']}")
        return out

    def _nk(self, hidden: int, inter: int) -> tuple[int, int]:
        return (2 * inter, hidden) if self.gemm == "gate_up" else (hidden, inter)

    def shape_from_model(self, model: ModelPreset, tp: int = 1, ep: int = 1) -> dict[str, Any]:
        e, inter = model.per_rank(tp, ep)
        n, k = self._nk(model.hidden, inter)
        return {"E": e, "N": n, "K": k, "top_k": model.top_k, "dtype": "bfloat16"}

    # ---- configs ------------------------------------------------------------------------------
    def check_config(self, config: Mapping[str, Any]) -> None:
        super().check_config(config)
        F.check_gemm_config(config, self.name)

    # Keys one design ignores or refuses: tl.dot's on the W8A16 GEMV, the GEMV's own on the tl.dot paths.
    _DOT_ONLY = {"BLOCK_SIZE_M": F.GEMM_DEFAULT["BLOCK_SIZE_M"], "SWAP_AB": 0, "W_TMA": 0, "num_stages": 1}
    _GEMV_ONLY = {"PREFETCH": 0, "GEMV_STAGES": 1}

    def candidates(self) -> Iterator[Config]:
        """The space's product per design (ALGO x A_FP8), with the keys that design ignores or refuses at
        the one value every problem's constraint keeps: the configs that pass the constraint are the full
        product's (tests/test_fp8_specs.py), drawn from 37,800 raw configs instead of 518,400. (With a
        fourth GEMV key the full product was 2.07 M and its checks took a sweep's planning 35 s on the H200
        host, session 14.)"""
        keys = list(self.space)
        for algo, a_fp8 in itertools.product(self.space["ALGO"], self.space["A_FP8"]):
            fixed = {"ALGO": algo, "A_FP8": a_fp8}
            if algo == "route" and a_fp8 == 0:
                fixed.update(self._DOT_ONLY)
            else:
                fixed.update(self._GEMV_ONLY)
                if algo == "route":
                    fixed.update(BLOCK_SIZE_M=self._DOT_ONLY["BLOCK_SIZE_M"], SWAP_AB=0)
            values = [[fixed[k]] if k in fixed else self.space[k] for k in keys]
            for combo in itertools.product(*values):
                yield dict(zip(keys, combo, strict=True))

    def canonical(self, config: Config) -> Config:
        """The W8A16 GEMV ignores num_stages (see :meth:`constraint`): rows stored with any value are
        one kernel, filed under num_stages 1."""
        cfg = dict(config)
        if cfg.get("ALGO", "route") == "route" and not cfg.get("A_FP8", 0) and not cfg.get("FUSE", 0):
            cfg["num_stages"] = 1
        return cfg

    def dominated(self, config: Config, device: DeviceInfo) -> str | None:
        """On sm_90, three designs are not searched. Every fp8 row of the committed H200 stores (74773
        measurements, 398 points, six models; ``benchmarks/dominated_designs.py``) says why:
        - grouped with A_FP8 0 (bf16 tensor cores) never came within 3% of a point's best (259 points);
        - PREFETCH 1 never did (78 points);
        - A_FP8 1 (activations split in every program) did at 10 of 313 points, and dropping it costs
          a point's best at most 1.8%, beyond one 8-route point where repeats of one config spread as
          far. It is 42% of the binaries of DeepSeek-V3 TP8 gate/up at 16 tokens."""
        if device.arch != "sm_90":
            return None
        cfg = {**F.GEMM_DEFAULT, **config}
        if cfg["ALGO"] == "grouped" and cfg["A_FP8"] == 0:
            return "dominated on sm_90: grouped with bf16 tensor cores (A_FP8 0)"
        if cfg["PREFETCH"]:
            return "dominated on sm_90: the prefetching GEMV (PREFETCH 1)"
        if cfg["A_FP8"] == 1:
            return "dominated on sm_90: activations split in every program (A_FP8 1; 2 splits them once)"
        return None

    def binary_key(self, config: Config) -> str:
        """SPLIT_K is a run-time argument of the GEMM kernels: every split of a tile runs one binary."""
        return canonical_json({k: v for k, v in self.canonical(config).items() if k != "SPLIT_K"})

    def compile_problem(self, problem: Problem) -> Problem:
        """Fewer experts: the GEMMs see E only through the grouped path's M-block count, unspecialized."""
        return fewer_experts(problem)

    def _bm_bound(self, problem: Problem) -> int:
        """The largest BLOCK_SIZE_M worth a candidate for the tl.dot algorithms: the routes rounded up to
        a power of two and, with uniform routing, 8x the routes per expert rounded up (at least 16).
        Larger M blocks are mostly padding: in the H200 stores (398 fp8 points, several models) M 32
        came within 3% of a point's best only at 4+ routes per expert and M 64 never."""
        bound = max(16, _next_pow2(problem.routes))
        if problem.routing == "uniform":
            bound = min(bound, max(16, 8 * _next_pow2(-(-problem.routes // problem.shape["E"]))))
        return min(max(self.space["BLOCK_SIZE_M"]), bound)

    def constraint_key(self, problem: Problem) -> tuple:
        """The constraint reads the shape and, for BLOCK_SIZE_M, its bound (``_bm_bound``)."""
        return problem.kernel, problem.shape_key, self._bm_bound(problem)

    def constraint(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        reason = super().constraint(config, problem, device)
        if reason:
            return reason
        cfg = {**F.GEMM_DEFAULT, **config}
        n, k = problem.shape["N"], problem.shape["K"]
        bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        if cfg["FUSE"]:
            return "FUSE is a layer option (activation / top_k sum fused in), not a GEMM config"
        if cfg["ALGO"] == "route" and bm != F.GEMM_DEFAULT["BLOCK_SIZE_M"]:
            return "BLOCK_SIZE_M only matters for the tl.dot algorithms (route keeps the default)"
        if cfg["ALGO"] == "route" and not cfg["A_FP8"] and cfg["num_stages"] != 1:
            # the kernel's num_stages pipelines only the loads that feed tl.dot: 3.6 and 3.9 build the
            # same sm_90 binary for every value here (tests/test_fp8_specs.py compiles them to check);
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
        elif F._plain_gemv(cfg):  # GEMV_STAGES - 1 weight and activation tiles staged ahead (sm_90, 3.6)
            smem = (cfg["GEMV_STAGES"] - 1) * (bn * bk + bk * a_bytes)
        elif cfg["ALGO"] == "route":  # weight tile per stage, and with A_FP8 1 the 16-row activation tile
            # it splits (BN128 BK512, 3 stages: 233472 B on sm_90, Triton 3.6, over the limit)
            smem = cfg["num_stages"] * (bn * bk + (16 * bk * a_bytes if cfg["A_FP8"] == 1 else 0))
        else:  # activation + fp8 weight tiles per stage, plus the converted operand
            smem = cfg["num_stages"] * (bm * bk * a_bytes + bk * bn) + 128 * bn * a_bytes
        if smem > device.max_shared_mem:
            return f"shared memory estimate {smem} B exceeds the device's {device.max_shared_mem} B"
        return None

    def heuristic(self, shape: Mapping[str, Any], routes: int, arch: str) -> Config:
        """Fallback from the H200 runs (results/fp8_decode.md). Up to ~1 row per expert the GEMV
        ("route") wins: most experts get one route, so grouping saves few weight reads and the
        grouped path's routing launch costs more; split-K only where the grid would be small.
        Above, "grouped" shares each expert's weight reads across its routes.

        sm_90 only, from session 4's DeepSeek-V3 TP8 run (E 256; gate/up K 7168, down K 256): activations
        split once into two fp8 terms (A_FP8 2) won every point but the short-K down GEMM at 1 and 4
        tokens. Short K: the W8A16 GEMV at 1 and 4 tokens (8.5, 23.0 us), grouped SWAP_AB A_FP8 2 at
        16 and 64 (64.1, 139.0 us); the edge at a quarter row per expert is a guess halfway (in log)
        between those points. Long K, revised on session 5's exhaustive reference slices (DeepSeek-V3
        and Qwen3-30B-A3B, K 7168 and 2048, at 1, 16 and 64 tokens; results/reference/): the one-route
        tl.dot (route, BN64 BK128) with split-K only until the grid has two programs per SM (S8 at
        DeepSeek-V3's 1 token, S1 at 16), 4 stages up to S2; grouped SWAP_AB BN64 BK256 above one row
        per expert. Against each point's best, this picks 1.000-1.054x at those six gate/up points
        (session 4's rule: 1.048-1.56x, worst at Qwen's 16 tokens, where S8 split a 2048-long K into
        2-block slices). Session 12: with the GEMV's in-thread partial sums, the one-launch W8A16 GEMV
        (BN32 BK512 S4, 8 warps) beat that pick where a launch's output is at most 4096 rows (DeepSeek-V3
        gate/up at 1 token: 12.76 against 14.94 us; at 2 tokens the two were within 3%, so the rule stops
        at 1). fp8 tensor-core dots need sm_89+, and other archs are unmeasured, so they keep session 1's
        rules."""
        n, k, e = shape["N"], shape["K"], shape["E"]
        if arch == "interpreter":  # fewest programs: the interpreter pays per program
            return {**F.GEMM_DEFAULT, "BLOCK_SIZE_N": min(128, max(16, triton.next_power_of_2(n))),
                    "BLOCK_SIZE_K": 256 if k > 128 else 128}
        long_k = k >= 2048
        if arch == "sm_90":
            if long_k and routes * n <= _SM90_GEMV_ROWS:
                # one launch, no activation split: where the launch is a large share of the time
                return {**F.GEMM_DEFAULT, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 512, "SPLIT_K": 4,
                        "num_warps": 8}
            if long_k and routes <= e:
                split = 1  # enough programs for two waves on 132 SMs, no more: a split re-reads nothing
                while split < 8 and routes * triton.cdiv(n, 64) * split < _SM90_PROGRAMS \
                        and 2 * split * 128 <= k:
                    split *= 2
                return {**F.GEMM_DEFAULT, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "SPLIT_K": split,
                        "A_FP8": 2, "num_stages": 4 if split <= 2 else 3}
            if long_k:
                return {**F.GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64,
                        "BLOCK_SIZE_K": 256, "SWAP_AB": 1, "A_FP8": 2, "num_stages": 3}
            if 4 * routes > e:
                return {**F.GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128,
                        "BLOCK_SIZE_K": 128, "SWAP_AB": 1, "A_FP8": 2, "num_stages": 3}
        if routes <= e:
            bk, split = (256 if k > 128 else 128), 1
            if long_k:
                split = max(1, min(4, _ROUTE_PROGRAMS // (max(1, routes) * triton.cdiv(n, 128))))
                bk = 512 if split > 1 and k >= 4096 else bk
            split = min(split, triton.cdiv(k, bk))
            return {**F.GEMM_DEFAULT, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": bk, "SPLIT_K": split,
                    "num_warps": 8}
        return {**F.GEMM_DEFAULT, "ALGO": "grouped", "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 256 if long_k else 128, "SPLIT_K": 2 if long_k else 1, "num_stages": 3}

    # ---- running ------------------------------------------------------------------------------
    def make_weights(self, problem: Problem, device: str, seed: int) -> dict[str, torch.Tensor]:
        """Block-quantized fp8 expert weights and their scales (the expensive part, reused by the tuner)."""
        s = problem.shape
        e, n, k = s["E"], s["N"], s["K"]
        dgen = torch.Generator(device=device).manual_seed(seed)
        w = torch.empty(e, n, k, dtype=torch.float8_e4m3fn, device=device)
        scale = torch.empty(e, -(-n // 128), -(-k // 128), dtype=torch.float32, device=device)
        step = max(1, _WEIGHT_CHUNK_BYTES // (4 * n * k))  # fp32 experts drawn at once: a bounded peak
        for i in range(0, e, step):
            full = torch.randn(min(step, e - i), n, k, generator=dgen, device=device) * 0.05
            w[i:i + step], scale[i:i + step] = quantize_fp8_block(full)
        return {"w": w, "w_scale": scale}

    def make_inputs(self, problem: Problem, device: str, seed: int, *, weights: Any = None) -> Inputs:
        s = problem.shape
        e, k, top_k, dtype = s["E"], s["K"], s["top_k"], DTYPES[s["dtype"]]
        if weights is None:
            weights = self.make_weights(problem, device, seed)
        n = weights["w"].shape[1]
        dgen = torch.Generator(device=device).manual_seed(seed + 1)
        tokens = problem.tokens
        routes = tokens * top_k
        ids, rw = make_routes(tokens, top_k, e, routing=problem.routing,
                              active_fraction=problem.active_fraction, generator=dgen, device=device,
                              typical=True)
        rows = tokens if self.gemm == "gate_up" else routes
        a = torch.randn(rows, k, generator=dgen, device=device).to(dtype)
        out = torch.empty(routes, n, dtype=torch.float32, device=device)
        return Inputs({"a": a, "w": weights["w"], "w_scale": weights["w_scale"], "topk_ids": ids,
                       "topk_weights": rw}, (out,),
                      {"a_row_div": top_k if self.gemm == "gate_up" else 1, "weights": weights})

    # A K split writes [SPLIT_K, routes, N] fp32 partials, which the layer's next kernel (the gated
    # activation after gate/up, the top-k sum after down) adds as it reads them: so the timed op is the
    # GEMM alone, as in the layer, and ``collect`` adds the partials for the check only. (Until session
    # 12 the spec passed [routes, N] and fp8_block_gemm summed the partials in one launch more, ~2 us a
    # GEMM at 1 token on the H200, which older stored rows of SPLIT_K > 1 configs include.)
    def _partials(self, inputs: Inputs, split: int) -> torch.Tensor:
        parts = inputs.extra.setdefault("partials", {})
        if split not in parts:  # made on a config's first (untimed) run, then reused by its timed runs
            out = inputs.outputs[0]
            parts[split] = torch.full((split, *out.shape), float("nan"), dtype=out.dtype, device=out.device)
        return parts[split]

    # In the layer the gated activation writes the down GEMM's A_FP8 2 split of its input (no launch of
    # its own), so down's timed op takes the split made beforehand, on the config's first (untimed) run;
    # gate/up's split of x is a launch in the layer and stays in its timed op, unless only the kernel
    # is timed (``TimingOptions.kernel_only``), which also takes the grouped path's route alignment
    # made beforehand (the layer aligns once for both GEMMs).
    def _input_split(self, inputs: Inputs, config: Config) -> F.SplitRows | None:
        if config.get("A_FP8") != 2 or (self.gemm != "down" and not inputs.extra.get("kernel_only")):
            return None
        if "a_split" not in inputs.extra:
            inputs.extra["a_split"] = F.split_fp8_rows(inputs.tensors["a"])
        return inputs.extra["a_split"]

    def _aligned(self, inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor] | None:
        if config.get("ALGO") != "grouped" or not inputs.extra.get("kernel_only"):
            return None
        cache = inputs.extra.setdefault("aligned", {})
        bm = config.get("BLOCK_SIZE_M", F.GEMM_DEFAULT["BLOCK_SIZE_M"])
        if bm not in cache:
            t = inputs.tensors
            cache[bm] = F.align_routes(t["topk_ids"].reshape(-1), t["w"].shape[0], bm)
        return cache[bm]

    def run(self, inputs: Inputs, config: Config) -> None:
        t = inputs.tensors
        split = config.get("SPLIT_K", 1)
        out = inputs.outputs[0] if split == 1 else self._partials(inputs, split)
        F.fp8_block_gemm(t["a"], t["w"], t["w_scale"], t["topk_ids"], out, config,
                         a_row_div=inputs.extra["a_row_div"],
                         topk_weights=t["topk_weights"] if self.gemm == "down" else None,
                         aligned=self._aligned(inputs, config), a_split=self._input_split(inputs, config))

    def collect(self, inputs: Inputs, config: Config) -> None:
        split = config.get("SPLIT_K", 1)
        if split > 1:
            torch.sum(self._partials(inputs, split), dim=0, out=inputs.outputs[0])

    def poison(self, inputs: Inputs) -> None:
        super().poison(inputs)
        for parts in inputs.extra.get("partials", {}).values():
            parts.fill_(float("nan"))

    def reference(self, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        t = inputs.tensors
        out = routed_matmul(t["a"], t["topk_ids"], inputs.extra["a_row_div"], inputs.extra["weights"],
                            dequantize_fp8_block, t["w"].shape[1])
        if self.gemm == "down":
            out *= t["topk_weights"].reshape(-1, 1)
        return (out,)

    # ---- roofline -----------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem, inputs: Inputs | None = None) -> int:
        """Distinct experts' fp8 weights + fp32 scales, the activation rows read, fp32 outputs written."""
        s = problem.shape
        e, n, k, top_k = s["E"], s["N"], s["K"], s["top_k"]
        if inputs is not None:
            ids = inputs.tensors["topk_ids"]
            experts = float(torch.unique(ids[ids >= 0]).numel())
        else:  # expected distinct experts among `routes` uniform picks
            experts = e * (1.0 - (1.0 - 1.0 / e) ** problem.routes)
        per_expert = n * k + triton.cdiv(n, 128) * triton.cdiv(k, 128) * 4
        rows = problem.tokens if self.gemm == "gate_up" else problem.routes
        a_bytes = DTYPES[s["dtype"]].itemsize
        return int(experts * per_expert + rows * k * a_bytes + problem.tokens * top_k * n * 4)

    def flops(self, problem: Problem, inputs: Inputs | None = None) -> int:
        return 2 * problem.routes * problem.shape["N"] * problem.shape["K"]


class Fp8DecodeGateUp(_Fp8DecodeGemm):
    name = "fp8_decode.gate_up"
    gemm = "gate_up"
    description = "FP8 128x128 block-scale MoE decode, gate/up GEMM (A row = token), W8A16"


class Fp8DecodeDown(_Fp8DecodeGemm):
    name = "fp8_decode.down"
    gemm = "down"
    description = "FP8 128x128 block-scale MoE decode, down GEMM (A row = route, routing weight applied)"


register(Fp8DecodeGateUp())
register(Fp8DecodeDown())
