"""Model presets and Hugging Face config.json files: the shapes and weight formats moetune reads."""

from __future__ import annotations

import json

import pytest

from moetune.models import PRESETS, get_model, read_hf_config

# The MoE fields of the public config.json files (other fields trimmed; values as published).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "n_routed_experts": 384, "num_attention_heads": 64}
QWEN3_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
}
QWEN3_235B_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 4096,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_local_experts": 128, "experts_per_token": 4, "num_experts_per_tok": 4,
    "swiglu_limit": 7.0,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
}
DEEPSEEK_V4_FLASH = {
    "model_type": "deepseek_v4", "hidden_size": 4096, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "quantization_config": {"quant_method": "fp4"},
}


def _write(tmp_path, doc, name="model"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("doc, preset", [
    (DEEPSEEK_V3, "deepseek-v3"), (KIMI_K2, "kimi-k2"), (QWEN3_30B, "qwen3-30b-a3b"),
    (GPT_OSS_120B, "gpt-oss-120b"), (DEEPSEEK_V4_FLASH, "deepseek-v4-flash"),
])
def test_config_json_reads_as_the_matching_preset(tmp_path, doc, preset):
    m = read_hf_config(_write(tmp_path, doc))
    p = PRESETS[preset]
    assert (m.hidden, m.intermediate, m.experts, m.top_k, m.weight_format, m.activation, m.swiglu_limit) == \
        (p.hidden, p.intermediate, p.experts, p.top_k, p.weight_format, p.activation, p.swiglu_limit)


def test_fp8_variant_of_a_bf16_model(tmp_path):
    m = get_model(str(_write(tmp_path, QWEN3_235B_FP8) / "config.json"))
    got = (m.hidden, m.intermediate, m.experts, m.top_k, m.weight_format)
    assert got == (4096, 1536, 128, 8, "fp8_block")
    assert m.per_rank(tp=4) == (128, 384)


def test_get_model_takes_a_directory_and_the_specs_shape_it(tmp_path):
    from moetune.specs.registry import get_spec

    m = get_model(str(_write(tmp_path, DEEPSEEK_V3)))
    shape = get_spec("fp8_decode.gate_up").shape_from_model(m, tp=8)
    assert shape == {"E": 256, "N": 512, "K": 7168, "top_k": 8, "dtype": "bfloat16"}


@pytest.mark.parametrize("doc, match", [
    ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008},
     r"missing field n_routed_experts or num_experts or num_local_experts \(experts\).*'llama'.*not a MoE"),
    ({**DEEPSEEK_V3, "moe_intermediate_size": None}, "moe_intermediate_size must be a positive int"),
    ({k: v for k, v in DEEPSEEK_V3.items() if k != "moe_intermediate_size"},
     r"missing field moe_intermediate_size \(intermediate\)"),
    ({k: v for k, v in QWEN3_30B.items() if k != "num_experts_per_tok"}, "missing field num_experts_per_tok"),
    ({**DEEPSEEK_V3, "quantization_config": {"quant_method": "awq"}},
     "unknown quantization_config quant_method 'awq'"),
    ({**DEEPSEEK_V3, "quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}},
     "weight_block_size"),
    ({**DEEPSEEK_V3, "quantization_config": {"quant_method": "fp8"}}, "without weight_block_size"),
])
def test_a_config_the_reader_does_not_understand_is_one_line(tmp_path, doc, match):
    with pytest.raises(ValueError, match=match) as e:
        read_hf_config(_write(tmp_path, doc))
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_unreadable_and_unknown(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read a model config"):
        get_model(str(bad))
    with pytest.raises(ValueError, match="unknown model 'nope'.*config.json"):
        get_model("nope")
    with pytest.raises(ValueError, match="cannot read"):
        get_model(str(tmp_path / "missing" / "config.json"))
