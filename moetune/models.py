"""Models: the built-in presets (public config.json values), or a Hugging Face ``config.json``, and their
per-rank expert shapes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hidden: int
    intermediate: int  # moe_intermediate_size, per expert, before tensor parallelism
    experts: int
    top_k: int
    weight_format: str  # the checkpoints' expert format: "fp8_block", "fp4", "bf16"
    activation: str = "silu"
    swiglu_limit: float | None = None

    def per_rank(self, tp: int = 1, ep: int = 1) -> tuple[int, int]:
        """(experts, intermediate) held by one rank under tensor and expert parallelism."""
        if tp < 1 or ep < 1:
            raise ValueError(f"--tp and --ep must be >= 1, got tp={tp} ep={ep}")
        if self.intermediate % tp:
            raise ValueError(
                f"--tp {tp} does not divide {self.name}'s intermediate size {self.intermediate}"
            )
        if self.experts % ep:
            raise ValueError(f"--ep {ep} does not divide {self.name}'s {self.experts} experts")
        return self.experts // ep, self.intermediate // tp


PRESETS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("deepseek-v3", 7168, 2048, 256, 8, "fp8_block"),
        ModelPreset("deepseek-v4-flash", 4096, 2048, 256, 6, "fp4"),
        ModelPreset("qwen3-30b-a3b", 2048, 768, 128, 8, "bf16"),
        ModelPreset("qwen3-235b-a22b", 4096, 1536, 128, 8, "bf16"),
        ModelPreset("gpt-oss-120b", 2880, 2880, 128, 4, "fp4", activation="swiglu", swiglu_limit=7.0),
        ModelPreset("kimi-k2", 7168, 2048, 384, 8, "fp8_block"),
        # Small enough for the Triton interpreter on a CPU: the README's demo and the tests.
        ModelPreset("tiny", 256, 128, 8, 2, "fp8_block"),
    )
}
ALIASES = {"deepseek-r1": "deepseek-v3"}


def get_model(name: str) -> ModelPreset:
    """A preset by name, or the model a ``config.json`` (or a directory holding one) describes."""
    key = ALIASES.get(name.lower(), name.lower())
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name)
    if path.is_dir() or path.suffix == ".json" or path.exists():
        return read_hf_config(path)
    known = ", ".join(sorted(PRESETS) + sorted(ALIASES))
    raise ValueError(f"unknown model {name!r}; known models: {known}, or a Hugging Face config.json path")


# Field names of the MoE shape, in the order they are looked for: DeepSeek-V3/R1/V4 and Kimi K2
# (n_routed_experts), Qwen3-MoE (num_experts), gpt-oss (num_local_experts, experts_per_token, and its
# experts' intermediate_size).
_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size",),
    "intermediate": ("moe_intermediate_size", "intermediate_size"),
    "experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token"),
}
_DENSE_INTERMEDIATE = ("deepseek", "kimi", "qwen")  # model types whose intermediate_size is the dense MLP's


def read_hf_config(path: str | Path) -> ModelPreset:
    """The :class:`ModelPreset` of a Hugging Face ``config.json`` (a file, or a directory holding one).

    Reads hidden size, MoE intermediate size, routed experts and experts per token, and the expert weight
    format from ``quantization_config``: fp8 with 128x128 blocks -> "fp8_block", mxfp4 / fp4 -> "fp4",
    none -> "bf16". ValueError, one line naming the file and what is missing or not understood.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{file}: cannot read a model config: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{file}: a config.json is a JSON object")
    if isinstance(doc.get("text_config"), dict):  # multimodal wrappers keep the language model here
        doc = {**doc["text_config"], "quantization_config": doc.get("quantization_config")}
    model_type = str(doc.get("model_type", "?"))
    values = {}
    for what, names in _FIELDS.items():
        if what == "intermediate" and "moe_intermediate_size" not in doc \
                and any(t in model_type for t in _DENSE_INTERMEDIATE):
            names = ("moe_intermediate_size",)  # their intermediate_size is the dense MLP's, not an expert's
        found = next((n for n in names if n in doc), None)
        if found is None:
            hint = " (not a MoE model?)" if what in ("experts", "top_k") else ""
            raise ValueError(f"{file}: missing field {' or '.join(names)} ({what}) for model_type "
                             f"{model_type!r}{hint}")
        value = doc[found]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{file}: field {found} must be a positive int, got {value!r}")
        values[what] = value
    fmt = _weight_format(doc.get("quantization_config"), file)
    gpt_oss = model_type == "gpt_oss"
    limit = doc.get("swiglu_limit", 7.0 if gpt_oss else None)
    number = isinstance(limit, (int, float)) and not isinstance(limit, bool)
    if limit is not None and (not number or not limit > 0):
        raise ValueError(f"{file}: field swiglu_limit must be a positive number, got {limit!r}")
    name = str(doc.get("_name_or_path") or (path.name if path.is_dir() else file.parent.name) or model_type)
    return ModelPreset(name, values["hidden"], values["intermediate"], values["experts"], values["top_k"],
                       fmt, activation="swiglu" if gpt_oss else "silu",
                       swiglu_limit=float(limit) if limit is not None else None)


def _weight_format(quant: Any, file: Path) -> str:
    if quant is None:
        return "bf16"
    if not isinstance(quant, Mapping):
        raise ValueError(f"{file}: quantization_config must be an object, got {quant!r}")
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block is None:
            raise ValueError(f"{file}: quantization_config fp8 without weight_block_size (per-tensor fp8 "
                             "is not a format moetune's kernels take; they take 128x128 blocks)")
        if list(block) != [128, 128]:
            raise ValueError(f"{file}: quantization_config fp8 weight_block_size {block}: moetune's FP8 "
                             "path takes 128x128 blocks")
        return "fp8_block"
    if method in ("mxfp4", "fp4", "ds_fp4"):
        return "fp4"
    raise ValueError(f"{file}: unknown quantization_config quant_method {method or None!r}; moetune reads "
                     "fp8 (128x128 blocks), mxfp4/fp4, or no quantization (bf16)")
