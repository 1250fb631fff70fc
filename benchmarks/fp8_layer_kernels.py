"""Where an FP8 decode layer's time goes: GPU time per kernel of one ``fp8_decode_moe`` call (the
picker's tiles), from torch.profiler over repeated eager calls, at given tokens and active shares.

    PYTHONPATH=. python benchmarks/fp8_layer_kernels.py -m deepseek-v3 --tp 8 --tokens 1 64 --active 1 0 \
        --out $OUT
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from moetune.kernels.fp8_decode.layer import fp8_decode_moe
from moetune.models import get_model
from moetune.quant.fp8_block import quantize_fp8_block
from moetune.routing import make_routes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="deepseek-v3")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--active", type=float, nargs="+", default=[1.0, 0.0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = get_model(args.model)
    e, inter = model.per_rank(args.tp)
    h = model.hidden
    w13, s13 = quantize_fp8_block(torch.randn(e, 2 * inter, h, device="cuda") * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(e, h, inter, device="cuda") * 0.05)
    rows = []
    for t in args.tokens:
        for f in args.active:
            ids, rw = make_routes(t, model.top_k, e, active_fraction=f, device="cuda")
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            for hint in (None, f):
                def call():
                    return fp8_decode_moe(x, w13, s13, w2, s2, rw, ids, activation=model.activation,
                                          swiglu_limit=model.swiglu_limit, active_share=hint)
                call()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.calls):
                        call()
                    torch.cuda.synchronize()
                per = defaultdict(float)
                for ev in prof.events():
                    if ev.device_type.name == "CUDA":
                        per[ev.name[:60]] += ev.device_time_total / args.calls
                total = sum(per.values())
                rows.append({"tokens": t, "active": f, "hint": hint, "total_us": total, "kernels": dict(per)})
                print(f"t{t} a{f:g} hint {hint}: {total:.2f} us of GPU time per call")
                for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
                    print(f"    {us:8.2f} us  {name}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"fp8_layer_kernels_{model.name}_tp{args.tp}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
