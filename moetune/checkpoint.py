"""One MoE layer's routed experts, read from a checkpoint as it names and lays them out, in the layouts
the kernels take.

Sources: a ``.safetensors`` file, a checkpoint directory (its ``model.safetensors.index.json``, else every
``*.safetensors`` in it), or a mapping of tensor names to tensors. Each tensor is copied once, into its
kernel layout (or, where the layouts agree, not at all beyond the read). Missing tensors, wrong shapes and
unexpected dtypes raise ``ValueError`` naming the tensor.

Formats (``L`` = layer, ``e`` = expert, ``P`` = ``model.layers.{L}.mlp.experts``):

- ``deepseek-v3`` (DeepSeek-V3/R1, Kimi K2: FP8 128x128 blocks): ``P.{e}.{gate,up,down}_proj.weight``
  float8_e4m3fn ``[out, in]`` and ``...weight_scale_inv`` fp32 ``[ceil(out/128), ceil(in/128)]`` (the scale
  multiplies). -> ``w13 [E, 2I, H]`` (gate rows, then up rows), ``w13_scale``, ``w2 [E, H, I]``, ``w2_scale``
  for ``fp8_decode_moe``; activation ``silu``.
- ``gpt-oss`` (MXFP4): ``P.gate_up_proj_blocks`` uint8 ``[E, 2I, H/32, 16]`` (16 bytes per 32-value block,
  low nibble = even k, as :mod:`moetune.quant.mxfp4`), ``P.gate_up_proj_scales`` uint8 UE8M0
  ``[E, 2I, H/32]``, ``P.down_proj_blocks`` ``[E, H, I/32, 16]``, ``P.down_proj_scales`` ``[E, H, I/32]``,
  ``P.gate_up_proj_bias`` ``[E, 2I]``, ``P.down_proj_bias`` ``[E, H]``. Gate and up are interleaved by row
  (row 2j = gate j, 2j+1 = up j); here they are de-interleaved to gate rows then up rows
  (``[E, 2I, H/2]`` packed, ``[E, 2I, H/32]`` scales) for ``fp4_prefill_moe``. Activation ``swiglu`` with
  limit 7 (``config.json``'s ``swiglu_limit`` where present). The biases (bf16 in gpt-oss; the gate/up
  bias de-interleaved as its rows) go to ``fp4_prefill_moe``'s ``w13_bias`` / ``w2_bias``. Each bias is
  optional: a layer without ``P.gate_up_proj_bias`` (or ``P.down_proj_bias``) has no such bias, as in
  models of gpt-oss's layout trained without them; one present with another shape or dtype is an error.
- ``deepseek-v4`` (ds_fp4): names this module defines, following DeepSeek-V3's per-expert naming, as no
  public checkpoint layout was at hand: ``P.{e}.{gate,up,down}_proj.weight`` uint8 ``[out, in/2]`` (or
  int8 / float4_e2m1fn_x2 bytes, two E2M1 codes per byte, low nibble = even k) and ``...weight_scale``
  uint8 UE8M0 (or float8_e8m0fnu) ``[out, in/32]``. Activation ``silu``, clamped at ``config.json``'s
  ``swiglu_limit`` where present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moetune.quant.mxfp4 import scale_row_max

FORMATS = ("deepseek-v3", "gpt-oss", "deepseek-v4")
GPT_OSS_SWIGLU_LIMIT = 7.0
_BLOCK = 128  # the FP8 checkpoints' scale block
_BYTES = (torch.uint8, torch.int8) + tuple(
    getattr(torch, n) for n in ("float4_e2m1fn_x2", "float8_e8m0fnu") if hasattr(torch, n))


def _prefix(layer: int) -> str:
    return f"model.layers.{layer}.mlp.experts"


@dataclass(frozen=True)
class MoeLayerWeights:
    """One layer's routed experts in the kernels' layout, and the activation its model computes.

    ``kind`` is the kernel path: ``"fp8"`` (``fp8_decode_moe``: ``w13``/``w2`` float8_e4m3fn, fp32 block
    scales) or ``"fp4"`` (``fp4_prefill_moe``: ``w13``/``w2`` packed uint8 codes, uint8 UE8M0 scales, the
    scales' row maxima ``w13_scale_max``/``w2_scale_max`` made at load (``moetune.quant.scale_row_max``),
    and the optional biases ``w13_bias [E, 2I]``, ``w2_bias [E, H]``, which the FP8 path does not take).

    Call the layer as ``layer(x, *w.kernel_args(), topk_weights, topk_ids, **w.layer_kwargs())``."""

    format: str
    kind: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    activation: str
    swiglu_limit: float | None = None
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w13_scale_max: torch.Tensor | None = None
    w2_scale_max: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind == "fp8" and any(getattr(self, name) is not None for name in _FP4_ONLY):
            raise ValueError(f"{' / '.join(_FP4_ONLY)}: the FP8 path (fp8_decode_moe) takes none of them")

    @property
    def experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] // 2

    def kernel_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w13, w13_scale, w2, w2_scale)``, the layer's positional weight arguments (the biases travel
        as keywords: :meth:`layer_kwargs`)."""
        return self.w13, self.w13_scale, self.w2, self.w2_scale

    def layer_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the path's layer and reference take: the activation, and what an FP4 layer
        has of the biases and the scales' row maxima (a bias the layer lacks is left out)."""
        kw: dict[str, Any] = {"activation": self.activation, "swiglu_limit": self.swiglu_limit}
        for name in _FP4_ONLY:
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return kw


# the FP4 layer's optional keyword tensors
_FP4_ONLY = ("w13_bias", "w2_bias", "w13_scale_max", "w2_scale_max")


# ---- sources ----------------------------------------------------------------------------------------
class _Source:
    """Names -> tensors from a mapping, a safetensors file or a checkpoint directory (read lazily)."""

    def __init__(self, source: str | Path | Mapping[str, torch.Tensor]):
        self.config: dict[str, Any] = {}
        self._tensors: Mapping[str, torch.Tensor] | None = None
        self._files: dict[str, Path] = {}
        if isinstance(source, Mapping):
            self._tensors = source
            return
        path = Path(source)
        if path.is_dir():
            config = path / "config.json"
            if config.is_file():
                self.config = json.loads(config.read_text())
            index = path / "model.safetensors.index.json"
            if index.is_file():
                weight_map = json.loads(index.read_text()).get("weight_map", {})
                self._files = {name: path / file for name, file in weight_map.items()}
            else:
                for file in sorted(path.glob("*.safetensors")):
                    self._files.update(dict.fromkeys(_file_keys(file), file))
            if not self._files:
                raise ValueError(f"{path}: no safetensors files (nor model.safetensors.index.json)")
        elif path.is_file():
            self._files = dict.fromkeys(_file_keys(path), path)
        else:
            raise FileNotFoundError(f"checkpoint {path} does not exist")

    def names(self) -> set[str]:
        return set(self._tensors) if self._tensors is not None else set(self._files)

    def get(self, name: str) -> torch.Tensor:
        if self._tensors is not None:
            if name not in self._tensors:
                raise ValueError(f"tensor {name} is missing")
            t = self._tensors[name]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"tensor {name} is a {type(t).__name__}, not a torch.Tensor")
            return t
        if name not in self._files:
            raise ValueError(f"tensor {name} is missing from the checkpoint")
        return _read(self._files[name], lambda f: f.get_tensor(name))


def _read(path: Path, what):
    """``what(safe_open(path))``; an unreadable file is a ValueError naming it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return what(f)
    except Exception as e:  # safetensors raises its own SafetensorError, an Exception
        raise ValueError(f"cannot read {path}: {e}") from e


def _file_keys(path: Path) -> list[str]:
    return _read(path, lambda f: list(f.keys()))


def _check(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]) -> None:
    if t.dtype not in dtypes:
        raise ValueError(f"tensor {name} has dtype {t.dtype}, expected {' or '.join(map(str, dtypes))}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)}")


def _expert_count(src: _Source, layer: int, leaf: str) -> int:
    pattern = re.compile(re.escape(_prefix(layer)) + r"\.(\d+)\." + re.escape(leaf) + "$")
    ids = {int(m.group(1)) for name in src.names() if (m := pattern.match(name))}
    if not ids:
        raise ValueError(f"layer {layer} has no routed experts: tensor {_prefix(layer)}.0.{leaf} is missing")
    for e in range(max(ids) + 1):
        if e not in ids:
            raise ValueError(f"tensor {_prefix(layer)}.{e}.{leaf} is missing")
    return max(ids) + 1


def _per_expert(src: _Source, layer: int, *, scale_leaf: str, weight_dtypes, scale_dtypes, out_dtypes,
                k_div: int, scale_k: int, scale_n: int, device) -> tuple[torch.Tensor, ...]:
    """Per-expert gate/up/down weights and scales, each copied once into the stacked tensors: ``k_div``
    values per stored element along K, one scale per ``scale_n`` rows x ``scale_k`` columns."""
    p = _prefix(layer)
    e = _expert_count(src, layer, "gate_proj.weight")
    gate = src.get(f"{p}.0.gate_proj.weight")
    if gate.dim() != 2:
        raise ValueError(f"tensor {p}.0.gate_proj.weight must be 2-D [out, in], got {list(gate.shape)}")
    inter, h = gate.shape[0], gate.shape[1] * k_div
    if scale_n > 1 and inter % scale_n:
        raise ValueError(f"tensor {p}.0.gate_proj.weight: I = {inter} must be a multiple of {scale_n}, "
                         f"so that gate and up rows fill separate scale blocks of w13")
    w_dtype, s_dtype = out_dtypes

    def scale_shape(rows: int, cols: int) -> tuple[int, int]:
        return -(-rows // scale_n), -(-cols // scale_k)

    w13 = torch.empty(e, 2 * inter, h // k_div, dtype=w_dtype, device=device)
    w13_scale = torch.empty(e, 2 * scale_shape(inter, h)[0], scale_shape(inter, h)[1], dtype=s_dtype,
                            device=device)
    w2 = torch.empty(e, h, inter // k_div, dtype=w_dtype, device=device)
    w2_scale = torch.empty(e, *scale_shape(h, inter), dtype=s_dtype, device=device)
    sn = scale_shape(inter, h)[0]
    for x in range(e):
        for proj, rows, cols, w_out, s_out in (
                ("gate_proj", inter, h, w13[x, :inter], w13_scale[x, :sn]),
                ("up_proj", inter, h, w13[x, inter:], w13_scale[x, sn:]),
                ("down_proj", h, inter, w2[x], w2_scale[x])):
            wn, sname = f"{p}.{x}.{proj}.weight", f"{p}.{x}.{proj}.{scale_leaf}"
            w, s = src.get(wn), src.get(sname)
            _check(wn, w, weight_dtypes, (rows, cols // k_div))
            _check(sname, s, scale_dtypes, scale_shape(rows, cols))
            w_out.copy_(w.view(w_dtype) if w.dtype != w_dtype else w)
            s_out.copy_(s.view(s_dtype) if s.dtype != s_dtype and s.element_size() == 1 else s)
    return w13, w13_scale, w2, w2_scale


# ---- formats ----------------------------------------------------------------------------------------
def load_deepseek_v3_fp8(source: str | Path | Mapping[str, torch.Tensor], layer: int, *,
                         device: str | torch.device = "cpu") -> MoeLayerWeights:
    """DeepSeek-V3/R1 (and Kimi K2) FP8 block-scaled experts of ``layer`` (module docstring)."""
    src = _Source(source)
    w13, s13, w2, s2 = _per_expert(src, layer, scale_leaf="weight_scale_inv",
                                   weight_dtypes=(torch.float8_e4m3fn,), scale_dtypes=(torch.float32,),
                                   out_dtypes=(torch.float8_e4m3fn, torch.float32), k_div=1, scale_k=_BLOCK,
                                   scale_n=_BLOCK, device=device)
    return MoeLayerWeights("deepseek-v3", "fp8", w13, s13, w2, s2, activation="silu")


def load_deepseek_v4_fp4(source: str | Path | Mapping[str, torch.Tensor], layer: int, *,
                         device: str | torch.device = "cpu") -> MoeLayerWeights:
    """DeepSeek-V4 ds_fp4 experts of ``layer`` under the names the module docstring defines."""
    src = _Source(source)
    w13, s13, w2, s2 = _per_expert(src, layer, scale_leaf="weight_scale", weight_dtypes=_BYTES,
                                   scale_dtypes=_BYTES, out_dtypes=(torch.uint8, torch.uint8), k_div=2,
                                   scale_k=32, scale_n=1, device=device)
    return MoeLayerWeights("deepseek-v4", "fp4", w13, s13, w2, s2, activation="silu",
                           swiglu_limit=src.config.get("swiglu_limit"), w13_scale_max=scale_row_max(s13),
                           w2_scale_max=scale_row_max(s2))


def _deinterleave(t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Rows ``[g0, u0, g1, u1, ...]`` along dim 1 -> ``[g0, g1, ..., u0, u1, ...]``, one copy into ``out``."""
    e, two_i = t.shape[:2]
    out.view(e, 2, two_i // 2, *t.shape[2:]).copy_(t.reshape(e, two_i // 2, 2, *t.shape[2:]).transpose(1, 2))
    return out


def load_gpt_oss_mxfp4(source: str | Path | Mapping[str, torch.Tensor], layer: int, *,
                       device: str | torch.device = "cpu") -> MoeLayerWeights:
    """gpt-oss MXFP4 experts of ``layer`` (module docstring), gate/up de-interleaved."""
    src = _Source(source)
    p = _prefix(layer)
    gu_blocks = src.get(f"{p}.gate_up_proj_blocks")
    if gu_blocks.dim() != 4 or gu_blocks.shape[-1] != 16 or gu_blocks.shape[1] % 2:
        raise ValueError(f"tensor {p}.gate_up_proj_blocks has shape {list(gu_blocks.shape)}, "
                         f"expected [E, 2I, H/32, 16]")
    e, two_i, hb, _ = gu_blocks.shape
    h, inter = hb * 32, two_i // 2
    tensors = {
        "gate_up_proj_blocks": ((torch.uint8,), (e, two_i, hb, 16)),
        "gate_up_proj_scales": ((torch.uint8,), (e, two_i, hb)),
        "down_proj_blocks": ((torch.uint8,), (e, h, inter // 32, 16)),
        "down_proj_scales": ((torch.uint8,), (e, h, inter // 32)),
    }
    got = {}
    for leaf, (dtypes, shape) in tensors.items():
        got[leaf] = src.get(f"{p}.{leaf}")
        _check(f"{p}.{leaf}", got[leaf], dtypes, shape)
    if inter % 32:
        raise ValueError(f"tensor {p}.down_proj_blocks: I = {inter} must be a multiple of 32")
    w13 = _deinterleave(got["gate_up_proj_blocks"].reshape(e, two_i, h // 2),
                        torch.empty(e, two_i, h // 2, dtype=torch.uint8, device=device))
    s13 = _deinterleave(got["gate_up_proj_scales"],
                        torch.empty(e, two_i, hb, dtype=torch.uint8, device=device))
    w2 = got["down_proj_blocks"].reshape(e, h, inter // 2).to(device).contiguous()
    s2 = got["down_proj_scales"].to(device).contiguous()
    names = src.names()
    biases: dict[str, torch.Tensor | None] = {}
    for leaf, shape in (("gate_up_proj_bias", (e, two_i)), ("down_proj_bias", (e, h))):
        name = f"{p}.{leaf}"
        biases[leaf] = src.get(name) if name in names else None  # absent: the layer has no such bias
        if biases[leaf] is not None:
            _check(name, biases[leaf], (torch.bfloat16, torch.float16, torch.float32), shape)
    b13, b2 = biases["gate_up_proj_bias"], biases["down_proj_bias"]
    if b13 is not None:
        b13 = _deinterleave(b13, torch.empty(e, two_i, dtype=b13.dtype, device=device))
    return MoeLayerWeights("gpt-oss", "fp4", w13, s13, w2, s2, activation="swiglu",
                           swiglu_limit=float(src.config.get("swiglu_limit", GPT_OSS_SWIGLU_LIMIT)),
                           w13_bias=b13, w2_bias=None if b2 is None else b2.to(device).contiguous(),
                           w13_scale_max=scale_row_max(s13), w2_scale_max=scale_row_max(s2))


LOADERS = {"deepseek-v3": load_deepseek_v3_fp8, "gpt-oss": load_gpt_oss_mxfp4,
           "deepseek-v4": load_deepseek_v4_fp4}


def detect_format(source: str | Path | Mapping[str, torch.Tensor], layer: int) -> str:
    """Which of :data:`FORMATS` names ``layer``'s experts in ``source``; ValueError if none."""
    names = _Source(source).names()
    p = _prefix(layer)
    if f"{p}.gate_up_proj_blocks" in names:
        return "gpt-oss"
    if f"{p}.0.gate_proj.weight_scale_inv" in names:
        return "deepseek-v3"
    if f"{p}.0.gate_proj.weight_scale" in names:
        return "deepseek-v4"
    raise ValueError(f"layer {layer}: no routed experts in a known layout (looked for "
                     f"{p}.gate_up_proj_blocks, {p}.0.gate_proj.weight_scale_inv and "
                     f"{p}.0.gate_proj.weight_scale)")


def load_moe_layer(source: str | Path | Mapping[str, torch.Tensor], layer: int, *, format: str | None = None,
                   device: str | torch.device = "cpu") -> MoeLayerWeights:
    """``layer``'s experts in the kernels' layout; ``format`` (one of :data:`FORMATS`) or detected."""
    fmt = format or detect_format(source, layer)
    if fmt not in LOADERS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    return LOADERS[fmt](source, layer, device=device)
