"""Where the time of the warp-specialized FP4 GEMM (``DECODE_WARPS``) goes: the kernel timed with parts of its
work taken out (GPU only; the outputs of the ablated kernels are wrong by design and are not checked).

Variants, each compiled in its own process (a JIT function's hash is taken once per process):
``full``; ``no_lut`` (each packed word stored as it is: no scale pool, no table lookup); ``no_mma`` (no
wgmma: the MMA warps still wait, rescale and store); ``no_act`` (no activation copies: the weights' only);
``no_store`` (the epilogue's global stores masked off); ``bf16_out`` (the per-route output in bf16, half
the bytes); ``exact_grid`` (the grid the routing fills, read back on the host, instead of the worst case's,
whose programs past the padded count exit at once); ``no_rowmax`` (the SWAP_AB 1 kernel's row maxima of the
weight scales a constant instead of loaded at each tile's start); and their combinations. Prints one JSON
line a variant; with ``--all`` (or ``--variants``), a table last.

    PYTHONPATH=. python benchmarks/ws_ablation.py --all --routes 24576 --gemm down \\
        --config '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3,
                   "DECODE_WARPS": 4}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

_COPY = None  # the real copy, for no_act
VARIANTS = ("full", "no_lut", "no_mma", "no_lut_no_mma", "no_act", "no_act_no_lut_no_mma", "no_store",
            "no_store_no_lut_no_mma", "bf16_out", "no_act_bf16_out", "no_act_no_store", "exact_grid",
            "no_rowmax")


def _replace(name: str, fn) -> None:
    """``name`` bound to ``fn`` in every Gluon kernel module that uses it (a JIT function reads the globals
    of its own module)."""
    from moetune.kernels.fp4_prefill import gluon_common, gluon_ring, gluon_smem, gluon_ws

    for module in (gluon_common, gluon_ring, gluon_smem, gluon_ws):
        if hasattr(module, name):
            setattr(module, name, fn)


def patch(variant: str) -> None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from moetune.kernels.fp4_prefill import gluon_common, gluon_ws

    if "no_lut" in variant:
        @gluon.jit
        def _words_as_they_are(words, s, rmax, BN: gl.constexpr):
            return gl.join(words, words)

        _replace("decode_words", _words_as_they_are)
    if "no_mma" in variant:
        @gluon.jit
        def _no_mma(a, b, acc, use_acc, is_async):
            return acc

        @gluon.jit
        def _no_wait(num_outstanding, deps):
            return deps[0]

        _replace("warpgroup_mma", _no_mma)
        _replace("warpgroup_mma_wait", _no_wait)
    if "no_act" in variant:
        global _COPY
        _COPY = gluon_common.async_load

        @gluon.jit
        def _weights_only(dst, src, mask=None):
            if dst.dtype == gl.int32:  # the packed weights' ring; the activations' is fp8
                _COPY(dst, src)

        _replace("async_load", _weights_only)
    if "no_store" in variant:
        gluon_ws._ws_mma = _without_stores(gluon_ws)
    if "no_rowmax" in variant:
        @gluon.jit
        def _constant_row_max(ws_rows, num_k, S2: gl.constexpr, BN: gl.constexpr):
            return gl.full([BN, 1], 127, gl.int32, S2)

        _replace("row_max_scale", _constant_row_max)


def _without_stores(ws):
    """``_ws_mma`` of the module ``ws`` with its stores masked off, from its source (a JIT function needs a
    file to read)."""
    import importlib.util
    import inspect
    import tempfile

    src = inspect.getsource(ws._ws_mma.fn)
    store_mask = "mask=(row < routes)[:, None])"
    assert store_mask in src, "the epilogue's store changed: update this ablation"
    head = ("import moetune.kernels.fp4_prefill.gluon_ws as _ws\n"
            "globals().update({k: v for k, v in vars(_ws).items() if not k.startswith('__')})\n")
    path = os.path.join(tempfile.mkdtemp(), "ws_mma_no_store.py")
    with open(path, "w") as f:
        f.write(head + src.replace(store_mask, "mask=(row < 0)[:, None])"))
    spec = importlib.util.spec_from_file_location("ws_mma_no_store", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._ws_mma


def run(variant: str, gemm: str, routes: int, config: dict, decode_regs: int | None,
        resident_tiles: int | None = None, maxnreg: int | None = None) -> dict:
    import torch
    import triton

    patch(variant)
    from gluon_fp4 import GEMMS, gluon_config  # beside this script (path set in main)

    from moetune.kernels.fp4_prefill import gluon_gemm as fw
    from moetune.kernels.fp4_prefill.align import align_routes
    from moetune.quant.fp8_act import quantize_fp8_act
    from moetune.quant.mxfp4 import quantize_mxfp4

    n, k, a_div = GEMMS[gemm]
    cfg = gluon_config(json.dumps(config), gemm)
    if "bf16_out" in variant:  # (gate/up's rows too: an ablation, not a config the spec allows there)
        cfg["OUT_DTYPE"] = "bf16"
    if decode_regs:
        fw._DECODE_REGS[config["DECODE_WARPS"], cfg["OUT_DTYPE"]] = decode_regs
    if resident_tiles:
        fw.RESIDENT_N_TILES = resident_tiles
    if maxnreg:  # the non-specialized kernels' register cap (fw._maxnreg's)
        fw._maxnreg = lambda config: {"maxnreg": maxnreg}
    torch.manual_seed(0)
    e = 256
    w, ws = quantize_mxfp4(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.05)
    tokens = routes // 6
    rows = tokens if a_div == 6 else routes
    a, a_s = quantize_fp8_act(torch.randn(rows, k, device="cuda"), k_order="wgmma")
    topk = torch.stack([torch.randperm(e, device="cuda")[:6] for _ in range(tokens)]).to(torch.int32)
    align = align_routes(topk, e, cfg["BLOCK_SIZE_M"])
    if "exact_grid" in variant:
        used = int(align.num_padded) // cfg["BLOCK_SIZE_M"]
        align = dataclasses.replace(align, expert_ids=align.expert_ids[:used])
    dtype = torch.bfloat16 if "bf16_out" in variant else torch.float32
    out = torch.empty((routes, n), device="cuda", dtype=dtype)
    us = triton.testing.do_bench_cudagraph(
        lambda: fw.launch(a, a_s, w, ws, out, align, a_div=a_div, gathered=False, config=cfg,
                          a_k_order="wgmma")) * 1e3
    return {"variant": variant, "gemm": gemm, "routes": routes, "config": config, "decode_regs": decode_regs,
            "resident_tiles": resident_tiles, "maxnreg": maxnreg, "us": round(us, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, default="full")
    ap.add_argument("--all", action="store_true", help="every variant, each in its own process")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, help="these variants, each in its own process")
    ap.add_argument("--gemm", choices=["gate_up", "down"], default="down")
    ap.add_argument("--routes", type=int, default=24576)
    ap.add_argument("--decode-regs", type=int, help="registers a decode thread (default: the launcher's)")
    ap.add_argument("--resident-tiles", type=int, help="N tiles a SWAP_AB 1 A_RESIDENT program takes")
    ap.add_argument("--maxnreg", type=int, help="register cap of the kernels without DECODE_WARPS")
    ap.add_argument("--config", default='{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8, '
                                        '"num_stages": 3, "DECODE_WARPS": 4}')
    args = ap.parse_args()
    config = {"SWAP_AB": 0, "GROUP_SIZE_M": 8, **json.loads(args.config)}
    if not (args.all or args.variants):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        row = run(args.variant, args.gemm, args.routes, config, args.decode_regs, args.resident_tiles,
                  args.maxnreg)
        print(json.dumps(row), flush=True)
        return
    rows = []
    for variant in args.variants or VARIANTS:
        cmd = [sys.executable, __file__, "--variant", variant, "--gemm", args.gemm, "--routes",
               str(args.routes), "--config", json.dumps(config)]
        if args.decode_regs:
            cmd += ["--decode-regs", str(args.decode_regs)]
        if args.resident_tiles:
            cmd += ["--resident-tiles", str(args.resident_tiles)]
        if args.maxnreg:
            cmd += ["--maxnreg", str(args.maxnreg)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else None
        failed = {"variant": variant, "us": None, "error": done.stderr[-800:]}
        rows.append(json.loads(line) if line else failed)
        print(json.dumps(rows[-1]), flush=True)
    print(f"| variant | {args.gemm} {args.routes} us |\n|---|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['us'] if r['us'] is not None else 'failed'} |")


if __name__ == "__main__":
    main()
