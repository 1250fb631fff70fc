"""H200 benchmark of the FP8 block-scale decode path (issue 2).

(a) CUDA-graph replay check: one capture per algorithm, replayed with all-active, mixed and
    all-inactive routes while inputs change, every buffer NaN-poisoned before each replay.
(c) Per GEMM, a hand sweep of configs (both algorithms) under CUDA graphs: best time and
    roofline fraction (distinct experts' weight + scale bytes, activations, outputs over 4.27 TB/s).
(b) The whole layer under CUDA graphs with the best configs from (c): skip path (ids -1) against
    the clamped path (ids -1 -> slot 0, weight 0), tokens 1/4/16/64, active 8/8, 4/8, 2/8, 0/8.

Each timed graph holds REPS launches, each with its own routing, so expert weights are not
served from L2 by the previous launch. Usage:
    PYTHONPATH=. python benchmarks/fp8_decode.py --out $OUT
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/fp8_decode.py --smoke   # CPU syntax check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from moetune.kernels import fp8_decode as F
from moetune.quant.fp8_block import quantize_fp8_block
from moetune.routing import make_routes

BW = 4.27e12  # measured device copy bandwidth, bytes/s
MODELS = {"deepseek-v3-tp8": dict(E=256, H=7168, I=256), "qwen3-30b-a3b": dict(E=128, H=2048, I=768)}
TOP_K = 8
TOKENS = (1, 4, 16, 64)
ACTIVE = (8, 4, 2, 0)


def route(bn, bk, split, warps=4, stages=1):
    return dict(ALGO="route", BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, SPLIT_K=split, num_warps=warps,
                num_stages=stages)


def grouped(bm, bn, bk, split, warps=4, stages=3, swap=0):
    return dict(ALGO="grouped", BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, SPLIT_K=split,
                SWAP_AB=swap, num_warps=warps, num_stages=stages)


SWEEP = [
    route(16, 128, 1, 4, 1),  # shipped default
    route(32, 512, 4), route(32, 512, 4, 4, 3), route(64, 512, 4), route(128, 512, 4, 8),
    route(32, 512, 7), route(32, 512, 14), route(16, 1024, 7), route(64, 512, 14, 8), route(64, 256, 4),
    route(64, 256, 1), route(128, 256, 1, 8), route(32, 256, 1), route(64, 128, 1),
    grouped(16, 64, 128, 1), grouped(16, 64, 128, 1, 4, 5), grouped(16, 128, 128, 1),
    grouped(16, 64, 256, 2), grouped(16, 64, 128, 4), grouped(16, 256, 128, 1, 8, 3),
    grouped(16, 64, 128, 1, 4, 3, 1), grouped(16, 128, 128, 1, 4, 3, 1), grouped(16, 64, 128, 4, 4, 3, 1),
    grouped(16, 128, 256, 1, 4, 3, 1), grouped(32, 128, 128, 1, 4, 3, 1), grouped(16, 128, 128, 2, 4, 4, 1),
    grouped(16, 128, 128, 1, 8, 4, 1), grouped(16, 64, 128, 2, 4, 4, 1),
]


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


_MODELS: dict = {}


def make_model(E, H, I, device, gen=None):
    """Random block-quantized expert banks, built once per shape (on the device: fast)."""
    key = (E, H, I, device)
    if key not in _MODELS:
        g = torch.Generator(device=device).manual_seed(E * 7 + H)
        w13, s13 = quantize_fp8_block(torch.randn(E, 2 * I, H, generator=g, device=device) * 0.05)
        w2, s2 = quantize_fp8_block(torch.randn(E, H, I, generator=g, device=device) * 0.05)
        _MODELS[key] = (w13, s13, w2, s2)
    return _MODELS[key]


def routes_for(tokens, E, active, gen, device, clamp=False):
    ids, rw = make_routes(tokens, TOP_K, E, active_fraction=active / TOP_K, generator=gen, device=device)
    if clamp:
        ids = torch.where(ids < 0, torch.zeros_like(ids), ids)
    return ids, rw


def time_graph(fn, reps, iters, smoke):
    """Median microseconds per fn call: a graph of `reps` calls (fn(i) uses input set i), replayed."""
    if smoke:
        for i in range(reps):
            fn(i)
        return float("nan")
    for i in range(reps):  # compile and warm up outside the capture
        fn(i)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    sync()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def gemm_bytes(ids, N, K, x_rows, a_bytes):
    experts = ids[ids >= 0].unique().numel()
    scales = -(-N // 128) * -(-K // 128) * 4
    return experts * (N * K + scales) + x_rows * K * a_bytes + ids.numel() * N * 4


def ref_gemm(a, w, s, ids, rw, a_row_div):
    from moetune.quant.fp8_block import dequantize_fp8_block

    flat = ids.reshape(-1)
    out = torch.zeros(flat.numel(), w.shape[1], device=a.device)
    for e in flat[flat >= 0].unique().tolist():
        rows = (flat == e).nonzero().flatten()
        out[rows] = a[rows // a_row_div].float() @ dequantize_fp8_block(w[e], s[e]).T
    if rw is not None:
        out *= rw.reshape(-1, 1)
    return out, flat >= 0


def graph_check(device, smoke, log):
    """(a): one capture per algorithm; routing, x and weights change between replays; buffers poisoned."""
    E, H, I, M = (8, 256, 128, 3) if smoke else (64, 1024, 384, 16)
    gen = torch.Generator().manual_seed(1)
    w13, s13, w2, s2 = make_model(E, H, I, device, gen)
    x = torch.randn(M, H, generator=gen).to(device, torch.bfloat16)
    ids, rw = routes_for(M, E, 8, gen, device)
    results = []
    for name, cfg in (("route", route(32, 256, 2)), ("grouped", grouped(16, 64, 128, 2, swap=1)),
                      ("mixed", None)):
        conf = ({"gate_up": F.check_gemm_config(cfg), "down": F.check_gemm_config(cfg)} if cfg else
                {"gate_up": F.check_gemm_config(grouped(16, 64, 256, 2, 4, 3, 1)),
                 "down": F.check_gemm_config(route(16, 128, 3))})
        bufs = F.layer_buffers(M, TOP_K, H, I, torch.bfloat16, conf, device)

        def layer(conf=conf, bufs=bufs):
            return F.decode_moe_into(x, w13, s13, w2, s2, rw, ids, conf, bufs, "silu", None)

        layer()
        sync()
        if not smoke:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                layer()
        for active in ((8, 0) if smoke else (8, 4, 0, 8, 2)):
            new_ids, new_rw = routes_for(M, E, active, gen, device)
            ids.copy_(new_ids)
            rw.copy_(new_rw)
            x.copy_(torch.randn(M, H, generator=gen).to(device, torch.bfloat16))
            for t in bufs.values():
                t.fill_(float("nan"))
            g.replay() if not smoke else layer()
            sync()
            ref = F.fp8_decode_moe_reference(x, w13, s13, w2, s2, rw, ids).float()
            out = bufs["out"].float()
            err = (((out - ref).norm() / ref.norm()).item() if active else out.abs().max().item())
            ok = bool(torch.isfinite(out).all()) and err < 1e-2
            results.append(dict(config=name, active=active, err=err, ok=ok))
            log(f"graph replay {name:8s} active {active}/8: err {err:.2e} {'ok' if ok else 'FAIL'}")
    return results


def gemm_sweep(device, smoke, log, reps, iters):
    """(c): per model, GEMM and token count, every SWEEP config; returns rows with the best marked."""
    rows = []
    models = {"tiny": dict(E=8, H=256, I=128)} if smoke else MODELS
    sweep = SWEEP[:1] + SWEEP[20:21] if smoke else SWEEP
    tokens_list = (1,) if smoke else TOKENS
    for mname, dims in models.items():
        E, H, I = dims["E"], dims["H"], dims["I"]
        gen = torch.Generator().manual_seed(2)
        w13, s13, w2, s2 = make_model(E, H, I, device, gen)
        for tokens in tokens_list:
            R = tokens * TOP_K
            sets = [routes_for(tokens, E, 8, gen, device) for _ in range(reps)]
            xs = [torch.randn(tokens, H, generator=gen).to(device, torch.bfloat16) for _ in range(reps)]
            acts = [torch.randn(R, I, generator=gen).to(device, torch.bfloat16) for _ in range(reps)]
            for gemm in ("gate_up", "down"):
                w, s, N, K = (w13, s13, 2 * I, H) if gemm == "gate_up" else (w2, s2, H, I)
                nbytes = statistics.mean(gemm_bytes(ids, N, K, tokens if gemm == "gate_up" else R, 2)
                                         for ids, _ in sets)
                ref = None
                for cfg in sweep:
                    c = F.check_gemm_config(cfg)
                    kblocks = -(-K // c["BLOCK_SIZE_K"])
                    if c["BLOCK_SIZE_N"] > N or c["BLOCK_SIZE_K"] > max(128, K) or c["SPLIT_K"] > kblocks:
                        continue
                    outs = [torch.empty(c["SPLIT_K"], R, N, device=device) for _ in range(reps)]
                    aligned = [F.align_routes(ids, E, c["BLOCK_SIZE_M"]) if c["ALGO"] == "grouped" else None
                               for ids, _ in sets]

                    def call(i, c=c, gemm=gemm, w=w, s=s, outs=outs, aligned=aligned, sets=sets, xs=xs,
                             acts=acts):
                        ids, rw = sets[i]
                        if gemm == "gate_up":
                            F.fp8_block_gemm(xs[i], w, s, ids, outs[i], c, a_row_div=TOP_K,
                                             aligned=aligned[i])
                        else:
                            F.fp8_block_gemm(acts[i], w, s, ids, outs[i], c, topk_weights=rw,
                                             aligned=aligned[i])

                    try:
                        us = time_graph(call, reps, iters, smoke)
                    except Exception as e:  # a config that fails to compile is reported, not fatal
                        log(f"{mname} {gemm} t={tokens} {cfg}: FAILED {type(e).__name__}: {e}")
                        continue
                    call(0)
                    sync()
                    if ref is None:
                        ids, rw = sets[0]
                        ref, act_mask = ref_gemm(xs[0] if gemm == "gate_up" else acts[0], w, s, ids,
                                                 rw if gemm == "down" else None,
                                                 TOP_K if gemm == "gate_up" else 1)
                    got = outs[0].sum(0)[act_mask]
                    err = ((got - ref[act_mask]).norm() / ref[act_mask].norm()).item()
                    frac = nbytes / BW / (us * 1e-6) if us == us else float("nan")
                    rows.append(dict(model=mname, gemm=gemm, tokens=tokens, config=cfg, us=us,
                                     roofline_us=nbytes / BW * 1e6, frac=frac, err=err))
                    log(f"{mname:16s} {gemm:7s} t={tokens:3d} {json.dumps(cfg, separators=(',', ':'))}: "
                        f"{us:8.2f} us  roofline {frac:6.1%}  err {err:.1e}")
                if not smoke:  # the grouped path's routing step, once per layer
                    us = time_graph(lambda i, sets=sets, E=E: F.align_routes(sets[i][0], E, 16), reps, iters,
                                    smoke)
                    log(f"{mname:16s} align_routes(BM 16) t={tokens:3d}: {us:.2f} us")
    return rows


def best_configs(rows):
    best = {}
    for r in rows:
        key = (r["model"], r["gemm"], r["tokens"])
        if r["err"] < 1e-2 and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    return best


def layer_bench(device, smoke, log, best, reps, iters):
    """(b): skip vs clamped, whole layer (all launches) under CUDA graphs with the best configs."""
    rows = []
    models = {"tiny": dict(E=8, H=256, I=128)} if smoke else MODELS
    for mname, dims in models.items():
        E, H, I = dims["E"], dims["H"], dims["I"]
        gen = torch.Generator().manual_seed(3)
        w13, s13, w2, s2 = make_model(E, H, I, device, gen)
        for tokens in ((1,) if smoke else TOKENS):
            conf = {g: F.check_gemm_config(best[(mname, g, tokens)]["config"]
                                           if (mname, g, tokens) in best else {}) for g in F.GEMMS}
            xs = [torch.randn(tokens, H, generator=gen).to(device, torch.bfloat16) for _ in range(reps)]
            bufs = [F.layer_buffers(tokens, TOP_K, H, I, torch.bfloat16, conf, device) for _ in range(reps)]
            for active in ((2,) if smoke else ACTIVE):
                base = [routes_for(tokens, E, active, gen, device) for _ in range(reps)]
                res = {}
                for path in ("skip", "clamped"):
                    sets = base if path == "skip" else [
                        (torch.where(i < 0, torch.zeros_like(i), i), w) for i, w in base]

                    def call(i, sets=sets, xs=xs, model=(w13, s13, w2, s2), conf=conf, bufs=bufs):
                        ids, rw = sets[i]
                        F.decode_moe_into(xs[i], *model, rw, ids, conf, bufs[i], "silu", None)

                    res[path] = time_graph(call, reps, iters, smoke)
                speedup = res["clamped"] / res["skip"]
                rows.append(dict(model=mname, tokens=tokens, active=active, skip_us=res["skip"],
                                 clamped_us=res["clamped"], speedup=speedup, config=conf))
                log(f"{mname:16s} layer t={tokens:3d} active {active}/8: skip {res['skip']:8.2f} us  "
                    f"clamped {res['clamped']:8.2f} us  {speedup:6.2f}x")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no graphs (CPU interpreter)")
    ap.add_argument("--reps", type=int, default=8, help="launches per graph, each with its own routing")
    ap.add_argument("--iters", type=int, default=25, help="graph replays timed")
    ap.add_argument("--configs", help="JSON file of configs replacing the built-in sweep")
    args = ap.parse_args()
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    if args.configs:
        SWEEP[:] = json.loads(Path(args.configs).read_text())
    if smoke:
        args.reps, args.iters = 1, 1
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = open(out_dir / "fp8_decode.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    if not smoke:
        import triton

        log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    t0 = time.time()
    checks = graph_check(device, smoke, log)
    log(f"[graph check {time.time() - t0:.0f}s]")
    rows = gemm_sweep(device, smoke, log, args.reps, args.iters)
    log(f"[sweep {time.time() - t0:.0f}s]")
    best = best_configs(rows)
    layers = layer_bench(device, smoke, log, best, args.reps, args.iters)
    log(f"[layer {time.time() - t0:.0f}s]")
    (out_dir / "fp8_decode.json").write_text(json.dumps(
        dict(graph_check=checks, sweep=rows, layer=layers,
             best={"|".join(map(str, k)): v for k, v in best.items()}), indent=1, default=str))

    log("\nbest config per GEMM (kernel time under CUDA graphs, median; roofline = bytes / 4.27 TB/s)")
    log(f"{'model':16s} {'gemm':7s} {'tok':>4s} {'us':>8s} {'floor':>8s} {'roof':>6s}  config")
    for (m, g, t), r in sorted(best.items()):
        c = r["config"]
        swap = " swapAB" if c.get("SWAP_AB") else ""
        desc = (f"{c['ALGO']} BM{c.get('BLOCK_SIZE_M', '-')} BN{c['BLOCK_SIZE_N']} BK{c['BLOCK_SIZE_K']} "
                f"S{c['SPLIT_K']} w{c['num_warps']} st{c['num_stages']}{swap}")
        log(f"{m:16s} {g:7s} {t:4d} {r['us']:8.2f} {r['roofline_us']:8.2f} {r['frac']:6.1%}  {desc}")
    log("\nwhole layer: skip (-1 ids) vs clamped (slot 0, weight 0)")
    log(f"{'model':16s} {'tok':>4s} {'act':>4s} {'skip us':>9s} {'clamp us':>9s} {'speedup':>8s}")
    for r in layers:
        log(f"{r['model']:16s} {r['tokens']:4d} {r['active']:2d}/8 {r['skip_us']:9.2f} "
            f"{r['clamped_us']:9.2f} {r['speedup']:7.2f}x")
    failed = [c for c in checks if not c["ok"]]
    log(f"graph replay check: {len(checks) - len(failed)}/{len(checks)} ok")
    logf.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
