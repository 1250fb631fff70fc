"""``moetune check-layer``: one checkpoint layer through the moetune layer and its fp32 reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from moetune.cli import app
from moetune.cli._common import console, user_errors


@app.command("check-layer")
def check_layer(
    checkpoint: Annotated[Path, typer.Argument(help="checkpoint directory (or one .safetensors file)")],
    layer: Annotated[int, typer.Option("--layer", "-l", help="decoder layer index (an MoE layer)")],
    format: Annotated[str | None, typer.Option(help="deepseek-v3, gpt-oss or deepseek-v4 "
                                                     "(default: from the tensor names)")] = None,
    tokens: Annotated[int, typer.Option(help="random activation rows")] = 4,
    top_k: Annotated[int | None, typer.Option(help="experts per token (default: config.json's "
                                                   "num_experts_per_tok, else 2)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the activations and the routing")] = 0,
    device: Annotated[str | None, typer.Option(help="torch device (default: cuda if available, else cpu, "
                                                    "which needs TRITON_INTERPRET=1)")] = None,
) -> None:
    """Load LAYER's routed experts, run the moetune layer and the fp32 reference on the same random
    activations and routing (with the layer's activation and expert biases), and print the relative error
    (Frobenius norm of the difference over the reference's)."""
    import json

    import torch

    from moetune.checkpoint import load_moe_layer

    with user_errors():
        if tokens < 1:
            raise ValueError(f"--tokens must be at least 1, got {tokens}")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        weights = load_moe_layer(checkpoint, layer, format=format, device=dev)
        args = weights.kernel_args()
        if top_k is None:
            config = checkpoint / "config.json"
            top_k = json.loads(config.read_text()).get("num_experts_per_tok", 2) if config.is_file() else 2
        if not 1 <= top_k <= weights.experts:
            raise ValueError(f"--top-k must lie in [1, {weights.experts}] (the layer's experts), got {top_k}")
        out, ref = _run(weights, args, tokens, top_k, seed, dev)
    err = ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
    path = "fp8_decode_moe" if weights.kind == "fp8" else "fp4_prefill_moe"
    limit = "" if weights.swiglu_limit is None else f", limit {weights.swiglu_limit:g}"
    biases = [name for name, b in (("gate_up", weights.w13_bias), ("down", weights.w2_bias)) if b is not None]
    bias = f", biases {' and '.join(biases)}" if biases else ""
    console.print(f"layer {layer}: {weights.format}, E {weights.experts}, H {weights.hidden}, "
                  f"I {weights.intermediate}, activation {weights.activation}{limit}{bias}",
                  highlight=False, soft_wrap=True)
    console.print(f"{tokens} tokens x top_k {top_k} on {dev.type}: moetune.{path} against "
                  f"moetune.reference.{path}: relative error {err:.3e}", highlight=False, soft_wrap=True)


def _run(weights, args, tokens: int, top_k: int, seed: int, device):
    import torch

    import moetune
    from moetune.routing import make_routes

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, weights.hidden, generator=g).to(device, torch.bfloat16)
    ids, rw = make_routes(tokens, top_k, weights.experts, generator=g, device=device)
    path = "fp8_decode_moe" if weights.kind == "fp8" else "fp4_prefill_moe"
    kw = weights.layer_kwargs()
    out = getattr(moetune, path)(x, *args, rw, ids, **kw)
    ref = getattr(moetune.reference, path)(x, *args, rw, ids, **kw)
    return out, ref
