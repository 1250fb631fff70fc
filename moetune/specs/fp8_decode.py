"""Specs of the FP8 block-scale decode GEMMs: ``fp8_decode.gate_up`` and ``fp8_decode.down``.

Both run ``moetune.kernels.fp8_decode.gemm.fp8_block_gemm``; the algorithm ("route" GEMV with
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

from moetune.device import DeviceInfo, arch_capability
from moetune.kernels.fp8_decode.align import align_routes
from moetune.kernels.fp8_decode.config import DTYPES, GEMM_DEFAULT, Fp8DecodeRules, gemm_shapes
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.pdl import PDL_MIN_CAPABILITY, resolve_pdl
from moetune.kernels.fp8_decode.split import SplitRows, split_fp8_rows
from moetune.models import ModelPreset
from moetune.problem import Config, Problem, canonical_json
from moetune.quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from moetune.routing import make_routes
from moetune.specs._routed_reference import routed_matmul
from moetune.specs.base import Inputs, KernelSpec, fewer_experts

_WEIGHT_CHUNK_BYTES = 1 << 30  # DeepSeek-V3 at TP 1 draws 30 GB of fp32 gate/up weights otherwise


class _Fp8DecodeGemm(Fp8DecodeRules, KernelSpec):
    tolerance = 1e-2
    cuda_graph = True
    weight_format = "fp8_block"

    # ---- shapes -------------------------------------------------------------------------------
    def shape_from_model(self, model: ModelPreset, tp: int = 1, ep: int = 1) -> dict[str, Any]:
        e, inter = model.per_rank(tp, ep)
        return gemm_shapes(e, model.hidden, inter, model.top_k, "bfloat16")[self.gemm]

    # ---- configs ------------------------------------------------------------------------------
    # Keys one design ignores or refuses: tl.dot's on the W8A16 GEMV, the GEMV's own on the tl.dot paths.
    _DOT_ONLY = {"BLOCK_SIZE_M": GEMM_DEFAULT["BLOCK_SIZE_M"], "SWAP_AB": 0, "W_TMA": 0, "num_stages": 1}
    _GEMV_ONLY = {"PREFETCH": 0, "GEMV_STAGES": 1}

    def candidates(self) -> Iterator[Config]:
        """The space's product per design (ALGO x A_FP8), with the keys that design ignores or refuses at
        the one value every problem's constraint keeps: the configs that pass the constraint are the full
        product's (tests/specs/test_fp8_specs.py), drawn from 37,800 raw configs instead of 518,400, which
        keeps a sweep's planning short."""
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

    def dominated(self, config: Config, device: DeviceInfo, shape: Mapping[str, Any] | None = None
                  ) -> str | None:
        """On sm_90, three designs are not searched: grouped with A_FP8 0 (bf16 tensor cores), PREFETCH 1,
        and A_FP8 1 (activations split in every program; A_FP8 2 splits them once). In the committed H200
        stores they (nearly) never came within 3% of a point's best (``tools/dominated_designs.py``;
        docs/kernels/fp8_decode.md, dominated designs)."""
        if device.arch != "sm_90":
            return None
        cfg = {**GEMM_DEFAULT, **config}
        if cfg["ALGO"] == "grouped" and cfg["A_FP8"] == 0:
            return "dominated on sm_90: grouped with bf16 tensor cores (A_FP8 0)"
        if cfg["PREFETCH"]:
            return "dominated on sm_90: the prefetching GEMV (PREFETCH 1)"
        if cfg["A_FP8"] == 1:
            return "dominated on sm_90: activations split in every program (A_FP8 1; 2 splits them once)"
        return None

    def design(self, config: Config) -> str:
        """The algorithm and the activations' precision: the route GEMV or grouped tensor-core blocks,
        bf16 or fp8 activations (which of them wins moves with route density)."""
        cfg = {**GEMM_DEFAULT, **config}
        return f"{cfg['ALGO']} A_FP8 {cfg['A_FP8']}"

    def binary_key(self, config: Config) -> str:
        """SPLIT_K is a run-time argument of the GEMM kernels: every split of a tile runs one binary."""
        return canonical_json({k: v for k, v in self.canonical(config).items() if k != "SPLIT_K"})

    def compile_problem(self, problem: Problem) -> Problem:
        """Fewer experts: the GEMMs see E only through the grouped path's M-block count, unspecialized."""
        return fewer_experts(problem)

    def constraint_key(self, problem: Problem) -> tuple:
        """The constraint reads the shape and, for BLOCK_SIZE_M, its bound (``_bm_bound``)."""
        return problem.kernel, problem.shape_key, self._bm_bound(problem)

    def launch_contract(self, arch: str) -> str | None:
        """"pdl" where the layer launches with programmatic dependent launch (``resolve_pdl``), else
        "plain"; the interpreter has no concurrent launches."""
        cap = arch_capability(arch)
        return "pdl" if cap is not None and cap >= PDL_MIN_CAPABILITY else "plain"

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
    # GEMM alone, as in the layer, and ``collect`` adds the partials for the check only.
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
    def _input_split(self, inputs: Inputs, config: Config) -> SplitRows | None:
        if config.get("A_FP8") != 2 or (self.gemm != "down" and not inputs.extra.get("kernel_only")):
            return None
        if "a_split" not in inputs.extra:
            inputs.extra["a_split"] = split_fp8_rows(inputs.tensors["a"])
        return inputs.extra["a_split"]

    def _aligned(self, inputs: Inputs, config: Config) -> tuple[torch.Tensor, torch.Tensor] | None:
        if config.get("ALGO") != "grouped" or not inputs.extra.get("kernel_only"):
            return None
        cache = inputs.extra.setdefault("aligned", {})
        bm = config.get("BLOCK_SIZE_M", GEMM_DEFAULT["BLOCK_SIZE_M"])
        if bm not in cache:
            t = inputs.tensors
            cache[bm] = align_routes(t["topk_ids"].reshape(-1), t["w"].shape[0], bm)
        return cache[bm]

    def run(self, inputs: Inputs, config: Config) -> None:
        t = inputs.tensors
        split = config.get("SPLIT_K", 1)
        out = inputs.outputs[0] if split == 1 else self._partials(inputs, split)
        fp8_block_gemm(t["a"], t["w"], t["w_scale"], t["topk_ids"], out, config,
                       a_row_div=inputs.extra["a_row_div"],
                       topk_weights=t["topk_weights"] if self.gemm == "down" else None,
                       aligned=self._aligned(inputs, config), a_split=self._input_split(inputs, config),
                       pdl=resolve_pdl(None, t["a"]), fill_inactive=False)

    # The layer's consumers skip inactive routes, so the GEMM leaves their rows unwritten there and here
    # alike (``fill_inactive=False``); the check zeroes them, untimed, to compare whole outputs.
    def collect(self, inputs: Inputs, config: Config) -> None:
        split = config.get("SPLIT_K", 1)
        out = inputs.outputs[0]
        if split > 1:
            torch.sum(self._partials(inputs, split), dim=0, out=out)
        out.masked_fill_((inputs.tensors["topk_ids"].reshape(-1) < 0)[:, None], 0.0)

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


SPECS = (Fp8DecodeGateUp(), Fp8DecodeDown())
