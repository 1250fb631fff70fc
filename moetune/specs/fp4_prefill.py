"""Kernel specs of the FP4 (MXFP4 weights, FP8 activations) grouped prefill GEMMs.

``fp4_prefill.gate_up``: A row = token (its fp8 activation), N = 2 * intermediate, K = hidden.
``fp4_prefill.down``: A row = route (the fp8 activated intermediate), N = hidden, K = intermediate.
The timed region is the GEMM on aligned inputs (alignment is done once per BLOCK_SIZE_M
and cached); with ``A_LAYOUT = "gathered"`` the one-launch row gather is timed with it.
The model's gated activation runs in a kernel of its own between the GEMMs (``act_quant.swiglu_quant``),
so neither spec, nor its tables, depends on it: down is timed on random fp8 intermediates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from moetune.device import DeviceInfo
from moetune.kernels.fp4_prefill.config import (
    GLUON_FIXED,
    GLUON_K,
    GLUON_ONLY,
    DownRules,
    Fp4PrefillRules,
    GateUpRules,
    _config_check,
    _tile_bounds,
    gemm_shapes,
    normalize_config,
    padded_k,
)
from moetune.models import ModelPreset
from moetune.problem import Config, Problem, canonical_json
from moetune.quant.mxfp4 import scale_row_max
from moetune.specs._routed_reference import routed_matmul
from moetune.specs.base import Inputs, KernelSpec, fewer_experts


class Fp4PrefillSpec(Fp4PrefillRules, KernelSpec):
    weight_format = "fp4"
    tolerance = 1e-2

    def candidates(self) -> Iterator[Config]:
        """The space's product without the configs no problem can run: the switches and BLOCK_SIZE_K are
        checked once per combination (and per M tile <= or > the N tile, all A_QUADS reads of the tiles, and
        per GROUP_SIZE_M 1 or not, all A_RESIDENT reads), each IMPL's combinations only with the values it
        can run of the keys it pins, and only the valid combinations are crossed with the tiles. The
        survivors of the constraint are the full product's (tests/specs/test_fp4_spec.py), about 40% of the
        raw product: checking every config of the raw product was half of a sweep's planning time."""
        tile_keys = [k for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "GROUP_SIZE_M", "num_warps", "num_stages")
                     if k in self.space]
        rest = [k for k in self.space if k not in tile_keys]
        combos = [c for impl in self.space.get("IMPL", (self.default["IMPL"],))
                  for c in itertools.product(*(self._switch_values(k, impl) for k in rest))]
        valid: dict[tuple[bool, bool], list[tuple]] = {}
        for m_over_n in (False, True):
            tile = {"BLOCK_SIZE_M": 32 if m_over_n else 16, "BLOCK_SIZE_N": 16 if m_over_n else 32,
                    "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 1}

            def ok(combo: tuple, tile: dict = tile, **tile_keys: int) -> bool:
                items = {**tile, **tile_keys, **dict(zip(rest, combo, strict=True))}.items()
                return _config_check(self.gemm, tuple(items))[0] is None

            valid[m_over_n, True] = [c for c in combos if ok(c)]
            # a larger GROUP_SIZE_M only takes configs away (A_RESIDENT's)
            valid[m_over_n, False] = [c for c in valid[m_over_n, True] if ok(c, GROUP_SIZE_M=8)]
        for tiles in itertools.product(*(self.space[k] for k in tile_keys)):
            fixed = dict(zip(tile_keys, tiles, strict=True))
            group_one = fixed.get("GROUP_SIZE_M", self.default["GROUP_SIZE_M"]) == 1
            for combo in valid[fixed["BLOCK_SIZE_M"] > fixed["BLOCK_SIZE_N"], group_one]:
                yield {**fixed, **dict(zip(rest, combo, strict=True))}

    def _switch_values(self, key: str, impl: str) -> tuple:
        """The values of ``key`` worth checking with ``impl``: the one an IMPL pins (GLUON_FIXED; the
        Gluon-only switches off with "triton"; none if the space lacks it), else the space's."""
        pinned = GLUON_FIXED if impl == "gluon" else dict.fromkeys(GLUON_ONLY, 0)
        if key == "IMPL":
            return (impl,)
        if key in pinned:
            return (pinned[key],) if pinned[key] in self.space[key] else ()
        return self.space[key]

    def shape_from_model(self, model: ModelPreset, tp: int = 1, ep: int = 1) -> dict[str, Any]:
        """The GEMM's shape with K padded to a multiple of 256 (``padded_k``): the width the weights take
        once ``moetune.quant.pad_mxfp4_k`` pads them at load, so that the Gluon kernels run them, and the
        shape ``fp4_prefill_moe`` then asks the picker for (gpt-oss-120b: K 2880 -> 3072). Weights loaded
        unpadded ask for their own K, which a table of that shape serves."""
        experts, inter = model.per_rank(tp, ep)
        return gemm_shapes(experts, model.hidden, inter, model.top_k, gate_up_k=padded_k(model.hidden),
                           down_k=padded_k(inter))[self.gemm]

    def binary_key(self, config: Config) -> str:
        """GROUP_SIZE_M is a run-time argument of the GEMM kernel: every value of a tile runs one binary."""
        return canonical_json({k: v for k, v in self.canonical(config).items() if k != "GROUP_SIZE_M"})

    def design(self, config: Config) -> str:
        """The implementation (Triton or Gluon) and how the weights are decoded (bf16, f16, fp8 dots)."""
        cfg = {**self.default, **config}
        return f"{cfg['IMPL']} {cfg['DECODE']}"

    def dominated(self, config: Config, device: DeviceInfo, shape: Mapping[str, Any] | None = None
                  ) -> str | None:
        """On sm_90, two decodes are not searched: DECODE f16 and fp8_scaled never came within 3% of a
        point's best in the committed H200 stores (``tools/dominated_designs.py --family fp4_prefill``;
        docs/kernels/fp4_prefill.md, DECODE). The fp8 decodes run the same dots with fp8 operands, at twice
        the f16 rate. Nor is IMPL triton at a shape the Gluon kernels run (K a multiple of 256): at every
        such point of those stores its best was at least 1.06x the Gluon best (docs/kernels/fp4_prefill.md,
        IMPL); it is 97% of the space there."""
        if device.arch != "sm_90":
            return None
        if config.get("DECODE") in ("f16", "fp8_scaled"):
            return f"dominated on sm_90: DECODE {config['DECODE']}"
        if shape is not None and config.get("IMPL", self.default["IMPL"]) == "triton" \
                and shape["K"] % GLUON_K == 0:
            return f"dominated on sm_90: IMPL triton where IMPL gluon runs (K {shape['K']})"
        return None

    def compile_problem(self, problem: Problem) -> Problem:
        """Fewer experts: the GEMMs see E only through the aligned routes' M-block count, unspecialized."""
        return fewer_experts(problem)

    def constraint_key(self, problem: Problem) -> tuple:
        """The constraint reads the shape and the tile bounds the density sets, as far as the space's
        tiles reach."""
        max_n, max_m = _tile_bounds(problem.shape["N"], problem.density)
        return (problem.kernel, problem.shape_key, min(max_n, max(self.space["BLOCK_SIZE_N"])),
                min(max_m, max(self.space["BLOCK_SIZE_M"])))

    # ---- inputs -------------------------------------------------------------------------
    def make_weights(self, problem: Problem, device: str, seed: int) -> dict[str, torch.Tensor]:
        """Packed MXFP4 expert weights, their scales and the scales' row maxima (the large part, reused by
        the tuner). The maxima are what a loader stores with the weights (``moetune.quant.scale_row_max``),
        so a candidate is timed as ``fp4_prefill_moe`` runs when given them."""
        shape = problem.shape
        e, n, k = shape["E"], shape["N"], shape["K"]
        dg = torch.Generator(device=device).manual_seed(seed)
        # Random codes and realistic scales (block maxima around 2^-7..2^-3) straight on the device.
        packed = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=device, generator=dg)
        scale = torch.randint(118, 124, (e, n, k // 32), dtype=torch.uint8, device=device, generator=dg)
        return {"w": packed, "w_scale": scale, "w_smax": scale_row_max(scale)}

    def make_inputs(self, problem: Problem, device: str, seed: int, *, weights: Any = None) -> Inputs:
        from moetune.quant.fp8_act import quantize_fp8_act, to_wgmma_k_order
        from moetune.routing import make_routes

        shape = problem.shape
        e, n, k, top_k = shape["E"], shape["N"], shape["K"], shape["top_k"]
        if weights is None:
            weights = self.make_weights(problem, device, seed)
        dg = torch.Generator(device=device).manual_seed(seed + 1)
        ids, topk_weights = make_routes(problem.tokens, top_k, e, routing=problem.routing,
                                        active_fraction=problem.active_fraction, generator=dg, device=device,
                                        typical=True)
        rows = problem.tokens if self.gemm == "gate_up" else problem.tokens * top_k
        a = torch.randn(rows, k, device=device, generator=dg)
        aq, a_s = quantize_fp8_act(a)
        out = torch.empty(problem.tokens * top_k, n, dtype=torch.float32, device=device)
        tensors = {"a": aq, "a_scale": a_s, "w": weights["w"], "w_scale": weights["w_scale"],
                   "topk_ids": ids, "topk_weights": topk_weights}
        # OUT_DTYPE bf16 writes here; ``collect`` widens it into the checked fp32 output
        extra = {"align": {}, "top_k": top_k, "weights": weights,
                 "out_bf16": torch.empty_like(out, dtype=torch.bfloat16)}
        if k % 128 == 0:  # for IMPL gluon
            extra["a_wgmma"] = to_wgmma_k_order(aq)
        return Inputs(tensors, (out,), extra=extra)

    def _align(self, inputs: Inputs, block_m: int):
        from moetune.kernels.fp4_prefill.align import align_routes

        cache = inputs.extra["align"]
        if block_m not in cache:
            t = inputs.tensors
            cache[block_m] = align_routes(t["topk_ids"], t["w"].shape[0], block_m)
        return cache[block_m]

    def run(self, inputs: Inputs, config: Config) -> None:
        """IMPL gluon is timed on the activations in its K order (``make_inputs`` copies them once): in
        ``fp4_prefill_moe`` their producers write that order (the quantizer's cast, the swiglu kernel's
        stores) at no cost."""
        from moetune.kernels.fp4_prefill.layer import grouped_gemm

        cfg = normalize_config(config, self.gemm)
        t = inputs.tensors
        a_div = inputs.extra["top_k"] if self.gemm == "gate_up" else 1
        a, order = t["a"], "real"
        if cfg["IMPL"] == "gluon" and "a_wgmma" in inputs.extra:
            a, order = inputs.extra["a_wgmma"], "wgmma"
        out = inputs.extra["out_bf16"] if cfg["OUT_DTYPE"] == "bf16" else inputs.outputs[0]
        grouped_gemm(a, t["a_scale"], t["w"], t["w_scale"], out, self._align(inputs, cfg["BLOCK_SIZE_M"]),
                     a_div=a_div, config=cfg, a_k_order=order, w_scale_max=inputs.extra["weights"]["w_smax"])

    def collect(self, inputs: Inputs, config: Config) -> None:
        if normalize_config(config, self.gemm)["OUT_DTYPE"] == "bf16":
            inputs.outputs[0].copy_(inputs.extra["out_bf16"])

    def poison(self, inputs: Inputs) -> None:
        """NaN in every row the op owns; rows of inactive routes are never written, so zero."""
        active = inputs.tensors["topk_ids"].reshape(-1) >= 0
        for out in (inputs.outputs[0], inputs.extra["out_bf16"]):
            out.fill_(float("nan"))
            out[~active] = 0.0

    def reference(self, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        from moetune.quant.fp8_act import dequantize_fp8_act
        from moetune.quant.mxfp4 import dequantize_mxfp4

        t = inputs.tensors
        a = dequantize_fp8_act(t["a"], t["a_scale"])
        row_div = inputs.extra["top_k"] if self.gemm == "gate_up" else 1
        return (routed_matmul(a, t["topk_ids"], row_div, inputs.extra["weights"], dequantize_mxfp4,
                              t["w"].shape[1], tf32_exact=True),)  # fp8 / e2m1 codes times powers of two

    # ---- roofline -----------------------------------------------------------------------
    def _active_and_experts(self, problem: Problem, inputs: Inputs | None) -> tuple[int, float]:
        e = problem.shape["E"]
        if inputs is not None:
            ids = inputs.tensors["topk_ids"]
            active = ids[ids >= 0]
            return int(active.numel()), float(torch.unique(active).numel())
        return problem.routes, e * (1 - (1 - 1 / e) ** problem.routes)

    def bytes_moved(self, problem: Problem, inputs: Inputs | None = None) -> int:
        """Touched experts' packed weights and scales, the A rows with their scales, fp32 outputs."""
        s = problem.shape
        routes, experts = self._active_and_experts(problem, inputs)
        weights = experts * s["N"] * (s["K"] // 2 + s["K"] // 32)
        rows = problem.tokens if self.gemm == "gate_up" else routes
        a = rows * (s["K"] + 4 * math.ceil(s["K"] / 128))
        return int(weights + a + routes * s["N"] * 4)

    def flops(self, problem: Problem, inputs: Inputs | None = None) -> int:
        routes, _ = self._active_and_experts(problem, inputs)
        return 2 * routes * problem.shape["N"] * problem.shape["K"]


class Fp4GateUpSpec(GateUpRules, Fp4PrefillSpec):
    description = "FP4 prefill gate/up grouped GEMM (A row = token, fp8 activations x MXFP4 weights)"


class Fp4DownSpec(DownRules, Fp4PrefillSpec):
    description = "FP4 prefill down grouped GEMM (A row = route, fp8 intermediate x MXFP4 weights)"


SPECS = (Fp4GateUpSpec(), Fp4DownSpec())
