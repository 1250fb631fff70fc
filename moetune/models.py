"""Model presets (public config.json values) and their per-rank expert shapes."""

from __future__ import annotations

from dataclasses import dataclass


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
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        known = ", ".join(sorted(PRESETS) + sorted(ALIASES))
        raise ValueError(f"unknown model {name!r}; known models: {known}")
    return PRESETS[key]
