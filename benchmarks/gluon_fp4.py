"""The Gluon FP4 GEMM (``IMPL "gluon"``, moetune/kernels/fp4_prefill/gluon_gemm.py) against the tables' picks,
on the GPU.

DeepSeek-V4-Flash TP=2, both GEMMs, at each --routes: the table's pick (the Triton kernel) and each --configs
entry (fp4_prefill configs; IMPL, DECODE, UNPACK, SWAP_AB and BLOCK_SIZE_K are set to the Gluon kernel's),
each checked against the pick's output (relative L2 difference under 1e-3) before it is timed
(``do_bench_cudagraph``). The Gluon configs read activations already in their K order, as in
``fp4_prefill_moe`` (whose quantizers write it); session 16's tables timed the launcher's copy as well.
Writes gluon_fp4.json / .md under --out and prints the table last.

    PYTHONPATH=. python benchmarks/gluon_fp4.py --out $OUT/g --routes 1536 6144 24576

Without a GPU, ``--offline`` compiles each config for sm_90 and prints registers and shared memory.
The design's history (versions, ablations, profiles): results/fp4_prefill.md, session 16.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from moetune.kernels.fp4_prefill.config import GLUON_FIXED, normalize_config

GEMMS = {"gate_up": (2048, 4096, 6), "down": (4096, 1024, 1)}  # N, K, A row divisor
DEFAULT_CONFIGS = [
    '{"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}',
    '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}',
    '{"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3}',
    '{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "num_warps": 4, "num_stages": 3, "SCALE_RING": 1}',
]


def gluon_config(text: str, gemm: str) -> dict:
    cfg = {"GROUP_SIZE_M": 8, "SWAP_AB": 1, **json.loads(text), "IMPL": "gluon", **GLUON_FIXED}
    return normalize_config(cfg, gemm)


def offline(configs: list[str]) -> None:
    from fp4_sm90_resources import resources  # beside this script

    from moetune.kernels.fp4_prefill.gluon_gemm import compile_for_sm90

    for text in configs:
        cfg = gluon_config(text, "gate_up")
        got = resources(compile_for_sm90(cfg), cfg["num_warps"])
        print(text, {key: got[key] for key in ("regs", "smem", "ctas_per_sm", "QGMMA", "LDL", "STL", "loop")})


def bench(out_dir: Path, routes_list: list[int], configs: list[str], gemms: list[str]) -> None:
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.kernels.fp4_prefill.layer import OUT_DTYPES, grouped_gemm
    from moetune.quant.fp8_act import quantize_fp8_act, to_wgmma_k_order
    from moetune.quant.mxfp4 import quantize_mxfp4
    from moetune.tables.picker import pick_config

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows = []
    for gemm in gemms:
        n, k, a_div = GEMMS[gemm]
        e = 256
        w, ws = quantize_mxfp4(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
        for routes in routes_list:
            tokens = routes // 6
            a, a_s = quantize_fp8_act(torch.randn(tokens if a_div == 6 else routes, k, device="cuda"))
            a_wgmma = to_wgmma_k_order(a)
            topk = torch.stack([torch.randperm(e, device="cuda")[:6] for _ in range(tokens)]).to(torch.int32)
            pick = pick_config(f"fp4_prefill.{gemm}", {"E": e, "N": n, "K": k, "top_k": 6}, routes)
            ref = None
            for variant, cfg in [("table pick", pick)] + [("gluon", gluon_config(c, gemm)) for c in configs]:
                align = align_routes(topk, e, cfg["BLOCK_SIZE_M"])
                out = torch.full((routes, n), float("nan"), device="cuda", dtype=OUT_DTYPES[cfg["OUT_DTYPE"]])

                order = "wgmma" if cfg["IMPL"] == "gluon" else "real"

                def run(a=a_wgmma if order == "wgmma" else a, a_s=a_s, w=w, ws=ws, out=out, align=align,
                        a_div=a_div, cfg=cfg, order=order):
                    grouped_gemm(a, a_s, w, ws, out, align, a_div=a_div, config=cfg, a_k_order=order)

                run()
                torch.cuda.synchronize()
                ref = out if ref is None else ref
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                tol = 1e-3 if out.dtype == ref.dtype == torch.float32 else 8e-3  # bf16 rows: their rounding
                us = triton.testing.do_bench_cudagraph(run) * 1e3 if err < tol else None
                rows.append({"gemm": gemm, "routes": routes, "variant": variant, "config": cfg, "us": us,
                             "rel_err": err})
                print(json.dumps(rows[-1]), flush=True)
    (out_dir / "gluon_fp4.json").write_text(json.dumps(rows, indent=1))
    base = {(r["gemm"], r["routes"]): r["us"] for r in rows if r["variant"] == "table pick"}
    lines = ["| gemm | routes | variant | config | us | x pick | rel err |",
             "|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        c = r["config"]
        smem = c["IMPL"] == "gluon" and not c["SWAP_AB"]
        desc = (f"BM{c['BLOCK_SIZE_M']} BN{c['BLOCK_SIZE_N']} BK{c['BLOCK_SIZE_K']} w{c['num_warps']} "
                f"s{c['num_stages']} {c['UNPACK']} {c['DECODE']}" + (" smem" if smem else "")
                + (" ring" if c["SCALE_RING"] else "") + (" halves" if c.get("MMA_HALVES") else "")
                + (f" dw{c['DECODE_WARPS']}" if c.get("DECODE_WARPS") else ""))
        us = f"{r['us']:.1f}" if r["us"] else "-"
        x = f"{base[(r['gemm'], r['routes'])] / r['us']:.3f}x" if r["us"] else "-"
        err = f"{r['rel_err']:.1e}"
        lines.append(f"| {r['gemm']} | {r['routes']} | {r['variant']} | {desc} | {us} | {x} | {err} |")
    (out_dir / "gluon_fp4.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gluon_out"))
    ap.add_argument("--routes", type=int, nargs="+", default=[1536, 6144, 24576])
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="fp4_prefill config JSON objects")
    ap.add_argument("--gemms", nargs="+", choices=list(GEMMS), default=list(GEMMS))
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU)")
    args = ap.parse_args()
    if args.offline:
        offline(args.configs)
    else:
        bench(args.out, args.routes, args.configs, args.gemms)


if __name__ == "__main__":
    main()
