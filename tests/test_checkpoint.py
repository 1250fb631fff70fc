"""moetune.checkpoint: synthetic safetensors checkpoints with the real tensor names (scaled-down shapes),
loaded back bit for bit against the quantizers; errors naming the tensor; ``moetune check-layer``."""

import json
import re

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from moetune.checkpoint import (
    MoeLayerWeights,
    detect_format,
    load_deepseek_v3_fp8,
    load_deepseek_v4_fp4,
    load_gpt_oss_mxfp4,
)
from moetune.cli import app
from moetune.quant import quantize_fp8_block, quantize_mxfp4

E, H, I, LAYER = 4, 256, 128, 3
P = f"model.layers.{LAYER}.mlp.experts"


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, 2 * I, H, generator=g) * 0.05, torch.randn(E, H, I, generator=g) * 0.05)


def v3_tensors(w13, w2):
    """Per-expert fp8 tensors as DeepSeek-V3 names them, quantized one projection at a time."""
    out = {}
    for e in range(E):
        for proj, w in (("gate_proj", w13[e, :I]), ("up_proj", w13[e, I:]), ("down_proj", w2[e])):
            q, s = quantize_fp8_block(w)
            out[f"{P}.{e}.{proj}.weight"], out[f"{P}.{e}.{proj}.weight_scale_inv"] = q, s
    return out


def v4_tensors(w13, w2, scale_dtype=torch.uint8):
    out = {}
    for e in range(E):
        for proj, w in (("gate_proj", w13[e, :I]), ("up_proj", w13[e, I:]), ("down_proj", w2[e])):
            q, s = quantize_mxfp4(w)
            out[f"{P}.{e}.{proj}.weight"], out[f"{P}.{e}.{proj}.weight_scale"] = q, s.view(scale_dtype)
    return out


def interleave(t):
    """Gate rows then up rows -> gpt-oss's rows (2j = gate j, 2j + 1 = up j)."""
    return torch.stack((t[:, :I], t[:, I:]), dim=2).reshape(t.shape)


def gpt_oss_tensors(w13, w2, b13, b2):
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    return {f"{P}.gate_up_proj_blocks": interleave(q13).reshape(E, 2 * I, H // 32, 16).contiguous(),
            f"{P}.gate_up_proj_scales": interleave(s13).contiguous(),
            f"{P}.down_proj_blocks": q2.reshape(E, H, I // 32, 16).contiguous(),
            f"{P}.down_proj_scales": s2,
            f"{P}.gate_up_proj_bias": interleave(b13).contiguous(), f"{P}.down_proj_bias": b2}


def write_checkpoint(path, tensors, config=None, shards=1):
    """``tensors`` split over ``shards`` files with a model.safetensors.index.json, as Hugging Face writes."""
    path.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::shards]}
        save_file(part, str(path / file))
        weight_map.update(dict.fromkeys(part, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# ---- round trips ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["file", "sharded-dir", "dict"])
def test_deepseek_v3_round_trip(tmp_path, kind):
    w13, w2 = weights()
    tensors = v3_tensors(w13, w2)
    if kind == "file":
        save_file(tensors, str(tmp_path / "layer.safetensors"))
        source = tmp_path / "layer.safetensors"
    else:
        source = write_checkpoint(tmp_path / "ckpt", tensors, shards=3) if kind == "sharded-dir" else tensors
    assert detect_format(source, LAYER) == "deepseek-v3"
    got = load_deepseek_v3_fp8(source, LAYER)
    q13, s13 = quantize_fp8_block(w13)
    q2, s2 = quantize_fp8_block(w2)
    assert same_bytes(got.w13, q13) and torch.equal(got.w13_scale, s13)
    assert same_bytes(got.w2, q2) and torch.equal(got.w2_scale, s2)
    assert (got.kind, got.activation, got.swiglu_limit) == ("fp8", "silu", None)
    assert (got.experts, got.hidden, got.intermediate) == (E, H, I)
    assert got.kernel_args()[0] is got.w13


@pytest.mark.parametrize("scale_dtype", [torch.uint8] + ([torch.float8_e8m0fnu]
                                                          if hasattr(torch, "float8_e8m0fnu") else []))
def test_deepseek_v4_round_trip(tmp_path, scale_dtype):
    w13, w2 = weights(1)
    ckpt = write_checkpoint(tmp_path / "v4", v4_tensors(w13, w2, scale_dtype), {"swiglu_limit": 10.0}, 2)
    assert detect_format(ckpt, LAYER) == "deepseek-v4"
    got = load_deepseek_v4_fp4(ckpt, LAYER)
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    assert same_bytes(got.w13, q13) and same_bytes(got.w13_scale, s13)
    assert same_bytes(got.w2, q2) and same_bytes(got.w2_scale, s2)
    assert (got.kind, got.activation, got.swiglu_limit) == ("fp4", "silu", 10.0)


def biases(seed=0):
    """gpt-oss's biases: bf16, of order 1."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(E, n, generator=g).to(torch.bfloat16) for n in (2 * I, H))


def test_gpt_oss_round_trip_deinterleaves_weights_and_biases(tmp_path):
    w13, w2 = weights(2)
    b13, b2 = biases(2)
    ckpt = write_checkpoint(tmp_path / "oss", gpt_oss_tensors(w13, w2, b13, b2))
    assert detect_format(ckpt, LAYER) == "gpt-oss"
    got = load_gpt_oss_mxfp4(ckpt, LAYER)
    q13, s13 = quantize_mxfp4(w13)
    q2, s2 = quantize_mxfp4(w2)
    assert same_bytes(got.w13, q13) and same_bytes(got.w13_scale, s13)
    assert same_bytes(got.w2, q2) and same_bytes(got.w2_scale, s2)
    assert same_bytes(got.w13_bias, b13) and same_bytes(got.w2_bias, b2)  # gate columns, then up columns
    assert (got.activation, got.swiglu_limit) == ("swiglu", 7.0)
    kw = got.layer_kwargs()  # the FP4 path computes the activation, and takes the biases
    assert {k: kw[k] for k in ("activation", "swiglu_limit")} == {"activation": "swiglu", "swiglu_limit": 7.0}
    assert kw["w13_bias"] is got.w13_bias and kw["w2_bias"] is got.w2_bias
    # and the scales' row maxima, made at load
    assert same_bytes(kw["w13_scale_max"], s13.amax(-1)) and same_bytes(kw["w2_scale_max"], s2.amax(-1))
    assert got.kernel_args() == (got.w13, got.w13_scale, got.w2, got.w2_scale)


@pytest.mark.parametrize("absent", [("gate_up_proj_bias",), ("down_proj_bias",),
                                    ("gate_up_proj_bias", "down_proj_bias")])
def test_gpt_oss_layer_without_biases_has_none(absent):
    tensors = gpt_oss_tensors(*weights(), *biases())
    for leaf in absent:
        del tensors[f"{P}.{leaf}"]
    got = load_gpt_oss_mxfp4(tensors, LAYER)
    assert (got.w13_bias is None) == ("gate_up_proj_bias" in absent)
    assert (got.w2_bias is None) == ("down_proj_bias" in absent)
    assert set(got.layer_kwargs()) == {"activation", "swiglu_limit", "w13_scale_max", "w2_scale_max"} | {
        {"gate_up_proj_bias": "w13_bias", "down_proj_bias": "w2_bias"}[leaf]
        for leaf in ("gate_up_proj_bias", "down_proj_bias") if leaf not in absent}


def test_fp8_layer_refuses_biases_and_row_maxima():
    w = load_deepseek_v3_fp8(v3_tensors(*weights()), LAYER)
    row_max = torch.zeros(E, 2 * I, dtype=torch.uint8)
    for extra in ({"w2_bias": torch.zeros(E, H)}, {"w13_scale_max": row_max}):
        with pytest.raises(ValueError, match="FP8 path .* takes none of them"):
            MoeLayerWeights("deepseek-v3", "fp8", w.w13, w.w13_scale, w.w2, w.w2_scale, "silu", **extra)


# ---- bad input: ValueError naming the tensor ------------------------------------------------------------
def test_missing_tensor():
    tensors = v3_tensors(*weights())
    del tensors[f"{P}.2.up_proj.weight_scale_inv"]
    with pytest.raises(ValueError, match=re.escape(f"{P}.2.up_proj.weight_scale_inv is missing")):
        load_deepseek_v3_fp8(tensors, LAYER)
    del tensors[f"{P}.1.gate_proj.weight"]
    with pytest.raises(ValueError, match=re.escape(f"{P}.1.gate_proj.weight is missing")):
        load_deepseek_v3_fp8(tensors, LAYER)
    with pytest.raises(ValueError, match="layer 0 has no routed experts"):
        load_deepseek_v3_fp8(tensors, 0)
    with pytest.raises(ValueError, match="no routed experts in a known layout"):
        detect_format(tensors, 0)


def test_missing_tensor_in_checkpoint_dir(tmp_path):
    tensors = gpt_oss_tensors(*weights(), torch.zeros(E, 2 * I), torch.zeros(E, H))
    del tensors[f"{P}.down_proj_scales"]
    with pytest.raises(ValueError, match=re.escape(f"{P}.down_proj_scales is missing from the checkpoint")):
        load_gpt_oss_mxfp4(write_checkpoint(tmp_path / "c", tensors), LAYER)


def test_unreadable_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read .*model.safetensors"):
        load_deepseek_v3_fp8(tmp_path, LAYER)


def test_mis_shaped_tensor():
    tensors = v3_tensors(*weights())
    name = f"{P}.3.down_proj.weight"
    tensors[name] = tensors[name][:, :-1]
    with pytest.raises(ValueError, match=re.escape(f"{name} has shape [256, 127], expected [256, 128]")):
        load_deepseek_v3_fp8(tensors, LAYER)
    oss = gpt_oss_tensors(*weights(), torch.zeros(E, 2 * I), torch.zeros(E, H))
    name = f"{P}.gate_up_proj_scales"
    oss[name] = oss[name][:, :, :-1]
    with pytest.raises(ValueError, match=re.escape(name)):
        load_gpt_oss_mxfp4(oss, LAYER)
    oss = gpt_oss_tensors(*weights(), torch.zeros(E, 2 * I), torch.zeros(E, H))
    oss[f"{P}.gate_up_proj_blocks"] = oss[f"{P}.gate_up_proj_blocks"].reshape(E, 2 * I, -1)
    with pytest.raises(ValueError, match=re.escape(f"{P}.gate_up_proj_blocks has shape")):
        load_gpt_oss_mxfp4(oss, LAYER)
    for leaf, bad in (("gate_up_proj_bias", torch.zeros(E, I)), ("down_proj_bias", torch.zeros(E, H, 1))):
        oss = gpt_oss_tensors(*weights(), *biases())
        oss[f"{P}.{leaf}"] = bad
        with pytest.raises(ValueError, match=re.escape(f"tensor {P}.{leaf} has shape")):
            load_gpt_oss_mxfp4(oss, LAYER)
    oss = gpt_oss_tensors(*weights(), *biases())
    oss[f"{P}.down_proj_bias"] = oss[f"{P}.down_proj_bias"].to(torch.int32)
    with pytest.raises(ValueError, match=re.escape(f"tensor {P}.down_proj_bias has dtype torch.int32")):
        load_gpt_oss_mxfp4(oss, LAYER)


def test_unexpected_dtype():
    tensors = v3_tensors(*weights())
    name = f"{P}.0.up_proj.weight_scale_inv"
    tensors[name] = tensors[name].to(torch.bfloat16)
    with pytest.raises(ValueError,
                       match=re.escape(f"{name} has dtype torch.bfloat16, expected torch.float32")):
        load_deepseek_v3_fp8(tensors, LAYER)
    tensors = v3_tensors(*weights())
    name = f"{P}.2.gate_proj.weight"
    tensors[name] = tensors[name].float()
    with pytest.raises(ValueError, match=re.escape(f"{name} has dtype torch.float32")):
        load_deepseek_v3_fp8(tensors, LAYER)


# ---- moetune check-layer ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, make, path", [("deepseek-v3", v3_tensors, "fp8_decode_moe"),
                                              ("deepseek-v4", v4_tensors, "fp4_prefill_moe")])
def test_check_layer(tmp_path, fmt, make, path):
    ckpt = write_checkpoint(tmp_path / fmt, make(*weights()), {"num_experts_per_tok": 2}, 2)
    result = CliRunner().invoke(app, ["check-layer", str(ckpt), "--layer", str(LAYER), "--tokens", "3"])
    assert result.exit_code == 0, result.output
    assert f"layer {LAYER}: {fmt}, E {E}, H {H}, I {I}, activation silu\n" in result.output
    match = re.search(rf"3 tokens x top_k 2 on (?:cpu|cuda): moetune.{path} against "
                      rf"moetune.reference.{path}: relative error (\S+)", result.output)
    assert match, result.output
    assert float(match.group(1)) < 1e-2


def test_check_layer_gpt_oss_with_biases(tmp_path):
    """gpt-oss's swiglu at limit 7 and both biases: the layer and the reference both take them, and the
    error is small (the biases change the output far more than that)."""
    w13, w2 = weights(4)
    b13, b2 = biases(4)
    ckpt = write_checkpoint(tmp_path / "oss", gpt_oss_tensors(w13, w2, b13, b2), {"num_experts_per_tok": 2})
    result = CliRunner().invoke(app, ["check-layer", str(ckpt), "--layer", str(LAYER), "--tokens", "3"])
    assert result.exit_code == 0, result.output
    assert (f"layer {LAYER}: gpt-oss, E {E}, H {H}, I {I}, activation swiglu, limit 7, biases gate_up and "
            f"down\n") in result.output
    match = re.search(r"3 tokens x top_k 2 on (?:cpu|cuda): moetune.fp4_prefill_moe against "
                      r"moetune.reference.fp4_prefill_moe: relative error (\S+)", result.output)
    assert match, result.output
    assert float(match.group(1)) < 1e-2
    from moetune.cli.checkpoint import _run

    got = load_gpt_oss_mxfp4(ckpt, LAYER)
    plain = MoeLayerWeights("gpt-oss", "fp4", *got.kernel_args(), "swiglu", 7.0)
    refs = [_run(w, w.kernel_args(), 3, 2, 0, torch.device("cpu"))[1] for w in (got, plain)]  # its inputs
    assert ((refs[0] - refs[1]).float().norm() / refs[0].float().norm()).item() > 0.1


def test_check_layer_errors(tmp_path):
    runner = CliRunner()
    tensors = gpt_oss_tensors(*weights(), torch.ones(E, 2 * I), torch.ones(E, H))
    oss = write_checkpoint(tmp_path / "oss", tensors)
    result = runner.invoke(app, ["check-layer", str(oss), "--layer", "0"])
    assert result.exit_code == 2 and "no routed experts in a known layout" in result.output
    result = runner.invoke(app, ["check-layer", str(tmp_path / "absent"), "--layer", "0"])
    assert result.exit_code == 2 and "does not exist" in result.output
