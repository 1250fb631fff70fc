"""H200 benchmark of the FP8 block-scale decode path: old best configs against the variants.

One call, within --budget seconds (compiles included), for DeepSeek-V3 TP=8 (E 256, H 7168, I 256,
top_k 8) at 1/4/16/64 tokens, everything under CUDA graphs:
(a) graph replay check: one capture per layer variant, replayed with 8/8, 2/8, 0/8 active routes while
    the inputs change, every buffer NaN-poisoned before each replay; results against the reference.
(b) each GEMM alone: the earlier best config ("old") against W8A16 GEMVs with pipelining and the A_FP8
    variants (two-term fp8 activations on fp8 tensor cores), each checked against a torch reference
    before it is timed, then the fastest again with programmatic dependent launch ("+pdl": each launch
    of the graph overlaps the one before), and, if it has A_FP8 2, once more with the activation split
    made outside the graph ("kern": the GEMM kernel alone, like the issue's figure for vLLM's fused_moe
    kernel, whose routing and activation quantization are kernels of their own); us and % of roofline
    (distinct experts' weight + scale bytes, activation rows, fp32 outputs, over 4.27 TB/s copy
    bandwidth).
(c) the whole layer (routing step, gate/up, activation, down, top_k sum): old vs this run's best GEMMs
    vs FUSE variants (activation in gate/up, top_k sum in down: fewer graph nodes), checked first;
    then skip (ids -1) vs clamped (ids -1 -> slot 0, weight 0) at 8/8, 2/8, 0/8 active for old, the
    fastest new layer and fused-1 (2 graph nodes).

Each timed graph holds --reps launches with their own routing (no L2 reuse between launches); median
of --iters replays, divided by --reps. Tokens run in order 1, 4, 16, 64, each complete before the next;
no new work starts once the budget is spent (what was skipped is listed). Usage:
    PYTHONPATH=. python benchmarks/fp8_decode.py --out $OUT --budget 200
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/fp8_decode.py --smoke --out /tmp/fp8   # CPU
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
import triton
import triton.language as tl

from moetune.kernels.fp8_decode.align import ALIGN_METHODS, align_routes
from moetune.kernels.fp8_decode.config import GEMMS, check_gemm_config
from moetune.kernels.fp8_decode.gemm import fp8_block_gemm
from moetune.kernels.fp8_decode.layer import decode_moe_into, layer_buffers
from moetune.kernels.fp8_decode.reference import fp8_decode_moe_reference
from moetune.kernels.fp8_decode.split import split_fp8_rows
from moetune.quant.fp8_block import dequantize_fp8_block, quantize_fp8_block
from moetune.routing import make_routes

BW = 4.27e12  # measured copy bandwidth, bytes/s
TOP_K = 8
TOL = 1e-2


def cfg(algo, bn, bk, split, warps=4, stages=1, bm=16, swap=0, a8=0, fuse=0, pf=0):
    return dict(ALGO=algo, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, SPLIT_K=split, SWAP_AB=swap,
                A_FP8=a8, FUSE=fuse, PREFETCH=pf, num_warps=warps, num_stages=stages)


# the earlier best hand configs per (GEMM, tokens)
OLD = {("gate_up", 1): cfg("route", 128, 512, 4, 8), ("gate_up", 4): cfg("route", 32, 512, 4, 4, 3),
       ("gate_up", 16): cfg("route", 128, 256, 1, 8), ("gate_up", 64): cfg("grouped", 64, 256, 2, 4, 3),
       ("down", 1): cfg("route", 128, 256, 1, 8), ("down", 4): cfg("route", 128, 256, 1, 8),
       ("down", 16): cfg("route", 128, 256, 1, 8), ("down", 64): cfg("grouped", 128, 128, 1, 4, 3)}
# the next winners, W8A16 GEMVs that load their next K chunk before multiplying this one (PREFETCH),
# then A_FP8 2 (activations split once by their own launch, both MMA operands
# through the pipelined loads: vLLM's w8a8 kernel's data flow with two activation terms); vLLM's H200
# table picks BM16 BN128 BK128 w4 st3-4 for this shape at every batch up to 512
NEW = {
    "gate_up": [cfg("route", 128, 512, 4, 8, 2), cfg("route", 32, 128, 8, 2, 1),
                cfg("route", 32, 128, 8, 2, pf=1), cfg("route", 64, 128, 8, 4, pf=1),
                cfg("route", 32, 128, 16, 2, pf=1),
                cfg("grouped", 128, 128, 2, 4, 4, swap=1, a8=1),
                cfg("route", 128, 256, 4, 4, 3, a8=2), cfg("route", 64, 128, 8, 4, 3, a8=2),
                cfg("grouped", 128, 128, 1, 4, 3, a8=2), cfg("grouped", 128, 128, 1, 4, 4, a8=2),
                cfg("grouped", 64, 128, 1, 4, 4, a8=2), cfg("grouped", 128, 128, 2, 4, 4, a8=2),
                cfg("grouped", 128, 128, 1, 4, 4, swap=1, a8=2),
                cfg("grouped", 256, 128, 1, 8, 4, swap=1, a8=2)],
    "down": [cfg("route", 64, 256, 1, 4, 2), cfg("route", 128, 128, 1, 8, pf=1),
             cfg("route", 64, 128, 1, 4, pf=1), cfg("grouped", 128, 128, 1, 4, 3, swap=1, a8=1),
             cfg("route", 128, 256, 1, 4, 2, a8=2), cfg("grouped", 128, 128, 1, 4, 3, a8=2),
             cfg("grouped", 64, 128, 1, 4, 3, a8=2), cfg("grouped", 128, 128, 1, 4, 2, a8=2),
             cfg("grouped", 128, 128, 1, 4, 3, swap=1, a8=2),
             cfg("grouped", 256, 128, 1, 8, 3, swap=1, a8=2)],
}
FUSED = {"gate_up": [cfg("route", 16, 512, 1, 4, 3, fuse=1), cfg("route", 32, 256, 1, 4, 3, fuse=1)],
         "down": [cfg("route", 32, 256, 1, 4, 2, fuse=1), cfg("route", 64, 256, 1, 8, 2, fuse=1)]}


def label(c):
    c = check_gemm_config(c)
    a8 = {1: "+a8", 2: "+a8split"}.get(c["A_FP8"], "")
    flags = "".join(f for f, on in (("+swap", c["SWAP_AB"]), (a8, a8), ("+fuse", c["FUSE"]),
                                    ("+prefetch", c["PREFETCH"])) if on)
    bm = f"BM{c['BLOCK_SIZE_M']} " if c["ALGO"] == "grouped" else ""
    return (f"{c['ALGO']} {bm}BN{c['BLOCK_SIZE_N']} BK{c['BLOCK_SIZE_K']} S{c['SPLIT_K']} "
            f"w{c['num_warps']} st{c['num_stages']}{flags}")


def fit(c, n, k):
    """The config shrunk to a (tiny, smoke) problem: tiles no larger than N and K, splits <= K blocks."""
    c = dict(c)
    c["BLOCK_SIZE_K"] = min(c["BLOCK_SIZE_K"], max(128, 1 << (k - 1).bit_length()))
    c["BLOCK_SIZE_N"] = min(c["BLOCK_SIZE_N"], max(16, 1 << (n - 1).bit_length()))
    c["SPLIT_K"] = min(c["SPLIT_K"], -(-k // c["BLOCK_SIZE_K"]))
    return c


class Bench:
    def __init__(self, args):
        self.smoke = args.smoke
        self.device = "cpu" if args.smoke else "cuda"
        self.reps, self.iters = (1, 1) if args.smoke else (args.reps, args.iters)
        self.deadline = time.time() + args.budget
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logf = open(self.out / "fp8_decode.log", "w")
        self.skipped: list[str] = []

    def log(self, msg):
        print(msg, flush=True)
        self.logf.write(msg + "\n")
        self.logf.flush()

    def time_left(self, what, need=0.0):
        if time.time() + need < self.deadline:
            return True
        self.skipped.append(what)
        self.log(f"budget spent: skipping {what}")
        return False

    def sync(self):
        if not self.smoke:
            torch.cuda.synchronize()

    def time_graph(self, fn):
        """Median us per fn(i) call, i over the reps input sets, from one graph of all reps calls."""
        for i in range(self.reps):
            fn(i)
        if self.smoke:
            return float("nan")
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(self.reps):
                fn(i)
        g.replay()
        self.sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.iters):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / self.reps)
        return statistics.median(times)


@triton.jit
def _store_one(p):
    tl.store(p + tl.program_id(0), 1.0)


def launch_floor(b: Bench) -> dict[int, float]:
    """us per launch, in the same graphs, of a kernel that only stores one value per program: the part of
    a 1-token GEMM's time that no tile choice can remove."""
    buf = torch.empty(1024, device=b.device)
    return {n: b.time_graph(lambda i, n=n: _store_one[(n,)](buf)) for n in (1, 132, 1024)}


def make_model(E, H, I, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    w13, s13 = quantize_fp8_block(torch.randn(E, 2 * I, H, generator=g, device=device) * 0.05)
    w2, s2 = quantize_fp8_block(torch.randn(E, H, I, generator=g, device=device) * 0.05)
    return w13, s13, w2, s2


def routes(tokens, E, active, gen, device):
    return make_routes(tokens, TOP_K, E, active_fraction=active / TOP_K, generator=gen, device=device)


def gemm_bytes(ids, N, K, rows, a_bytes=2):
    experts = ids[ids >= 0].unique().numel()
    return experts * (N * K + -(-N // 128) * -(-K // 128) * 4) + rows * K * a_bytes + ids.numel() * N * 4


def rel(out, ref, mask=None):
    out, ref = out.double(), ref.double()
    if mask is not None:
        out, ref = out[mask], ref[mask]
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def ref_gemm(a, w, s, ids, rw, a_row_div):
    flat = ids.reshape(-1)
    out = torch.zeros(flat.numel(), w.shape[1], device=a.device)
    for e in flat[flat >= 0].unique().tolist():
        r = (flat == e).nonzero().flatten()
        out[r] = a[r // a_row_div].float() @ dequantize_fp8_block(w[e], s[e]).T
    if rw is not None:
        out *= rw.reshape(-1, 1)
    return out


def layer_variants(tokens, best, N13, K13, N2, K2, shrink):
    """name -> per-GEMM configs for the layer timing."""
    g = {gm: [shrink(c, gm) for c in FUSED[gm]] for gm in GEMMS}
    out = {"old": {gm: shrink(OLD[(gm, tokens)], gm) for gm in GEMMS}}
    if best:
        out["new"] = dict(best)
        out["new+pdl"] = {**best, "pdl": True}  # every launch with programmatic dependent launch
        out["new+fused-down"] = {"gate_up": best["gate_up"], "down": g["down"][0]}
    out["fused-1"] = {"gate_up": g["gate_up"][0], "down": g["down"][0]}
    out["fused-2"] = {"gate_up": g["gate_up"][1], "down": g["down"][1]}
    return out


def run(b: Bench, args):
    E, H, I = (8, 128, 64) if b.smoke else (256, 7168, 256)
    token_list = (1,) if b.smoke else tuple(args.tokens)
    dev = b.device
    t0 = time.time()
    w13, s13, w2, s2 = make_model(E, H, I, dev)
    b.log(f"model E {E} H {H} I {I} top_k {TOP_K} built in {time.time() - t0:.1f}s")
    floor = launch_floor(b)
    b.log("launch floor (a store-only kernel, same graphs), us per launch: "
          + ", ".join(f"{n} programs {us:.2f}" for n, us in floor.items()))
    dims = {"gate_up": (2 * I, H), "down": (H, I)}

    def shrink(c, gemm):
        return fit(c, *dims[gemm]) if b.smoke else c

    gemm_rows, layer_rows, checks = [], [], []
    gen = torch.Generator().manual_seed(1)
    for tokens in token_list:
        if not b.time_left(f"tokens {tokens} (all)"):
            continue
        R = tokens * TOP_K
        sets = [routes(tokens, E, 8, gen, dev) for _ in range(b.reps)]
        xs = [torch.randn(tokens, H, generator=gen).to(dev, torch.bfloat16) for _ in range(b.reps)]
        acts = [torch.randn(R, I, generator=gen).to(dev, torch.bfloat16) for _ in range(b.reps)]
        best: dict[str, dict] = {}
        # ---- (b) each GEMM alone ----
        for gemm in GEMMS:
            w, s = (w13, s13) if gemm == "gate_up" else (w2, s2)
            N, K = dims[gemm]
            a_list = xs if gemm == "gate_up" else acts
            div = TOP_K if gemm == "gate_up" else 1
            nbytes = statistics.mean(gemm_bytes(ids, N, K, tokens if gemm == "gate_up" else R)
                                     for ids, _ in sets)
            ids0, rw0 = sets[0]
            ref = ref_gemm(a_list[0], w, s, ids0, rw0 if gemm == "down" else None, div)
            mask = ids0.reshape(-1) >= 0
            cands = [("old", shrink(OLD[(gemm, tokens)], gemm))]
            cands += [("new", shrink(c, gemm)) for c in NEW[gemm]]
            cands.append(("pdl", None))  # the fastest new one again, with programmatic dependent launch
            cands.append(("kern", None))  # and with its A_FP8 2 split made before the graph
            best_us = float("inf")
            for kind, c in cands:
                pdl, kern = kind == "pdl", kind == "kern"
                if pdl or kern:
                    if gemm not in best or kern and best[gemm]["A_FP8"] != 2:
                        continue
                    c = best[gemm]
                tag = "+pdl" if pdl else " kernel only" if kern else ""
                name = f"t={tokens} {gemm} {label(c)}{tag}"
                if not b.time_left(name, need=2.0):
                    break
                row = dict(tokens=tokens, gemm=gemm, kind=kind, config=label(c) + tag,
                           floor_us=nbytes / BW * 1e6)
                try:
                    cc = check_gemm_config(c)
                    outs = [torch.empty(cc["SPLIT_K"], R, N, device=dev) for _ in range(b.reps)]
                    grouped = cc["ALGO"] == "grouped"
                    aligned = [align_routes(ids, E, cc["BLOCK_SIZE_M"]) if grouped else None
                               for ids, _ in sets]
                    splits = [split_fp8_rows(a) if kern else None for a in a_list]

                    def call(i, cc=cc, outs=outs, aligned=aligned, splits=splits, w=w, s=s, a_list=a_list,
                             div=div, gemm=gemm, sets=sets, pdl=pdl):
                        ids, rw = sets[i]
                        fp8_block_gemm(a_list[i], w, s, ids, outs[i], cc, a_row_div=div, aligned=aligned[i],
                                         topk_weights=rw if gemm == "down" else None, a_split=splits[i],
                                         pdl=pdl)

                    outs[0].fill_(float("nan"))
                    call(0)
                    b.sync()
                    row["err"] = rel(outs[0].sum(0), ref, mask)
                    if row["err"] < TOL:
                        row["us"] = b.time_graph(call)
                        row["roofline"] = nbytes / BW / (row["us"] * 1e-6)
                        if kind == "new" and row["us"] < best_us or (b.smoke and gemm not in best):
                            best_us, best[gemm] = row["us"], c
                    else:
                        row["status"] = "inaccurate"
                except Exception as e:  # a variant that fails to compile or run is recorded, not fatal
                    row["status"] = f"error {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                gemm_rows.append(row)
                b.log(f"t={tokens:3d} {gemm:7s} {kind:3s} {row['config']:44s} "
                      + (f"{row['us']:8.2f} us {row['roofline']:6.1%}  err {row['err']:.1e}" if "us" in row
                         else row.get("status", "")))
        for method in ALIGN_METHODS:  # the grouped path's routing step, paid once per layer
            try:
                pairs = [(align_routes(ids, E, 16, "onehot"), align_routes(ids, E, 16, method))
                         for ids, _ in sets]
                same = all(torch.equal(p, q) for one, other in pairs for p, q in zip(one, other, strict=True))
                us = b.time_graph(lambda i, sets=sets, m=method: align_routes(sets[i][0], E, 16, m))
            except Exception as e:
                same, us = f"error {type(e).__name__}: {str(e).splitlines()[0][:160]}", float("nan")
            b.log(f"t={tokens:3d} align_routes BM16 {method}: {us:.2f} us  same as onehot: {same}")
            kind = "old" if method == "onehot" else "new"
            gemm_rows.append(dict(tokens=tokens, gemm="align_routes", kind=kind, config=f"BM16 {method}",
                                  us=us, same=same))
        # ---- (c) the whole layer ----
        variants = layer_variants(tokens, best if len(best) == 2 else None, *dims["gate_up"], *dims["down"],
                                  shrink)
        floor = statistics.mean(gemm_bytes(ids, 2 * I, H, tokens) + gemm_bytes(ids, H, I, R)
                                for ids, _ in sets)
        results = {}
        for vname, conf in variants.items():
            if not b.time_left(f"t={tokens} layer {vname}", need=3.0):
                break
            pdl = conf.get("pdl", False)
            conf = {gm: check_gemm_config(conf[gm]) for gm in GEMMS}
            results[vname] = res = dict(tokens=tokens, variant=vname, floor_us=floor / BW * 1e6,
                                        config={gm: label(c) for gm, c in conf.items()})
            try:
                res.update(layer_times(b, conf, (w13, s13, w2, s2), tokens, E, H, I, xs, gen,
                                       actives=(8,), clamp=False, pdl=pdl))
            except Exception as e:
                res["status"] = f"error {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            msg = (f"{res['skip_8']:8.2f} us {floor / BW / (res['skip_8'] * 1e-6):6.1%}  "
                   f"err {res['err_8']:.1e}" if "skip_8" in res else res.get("status", ""))
            b.log(f"t={tokens:3d} layer {vname:15s} {msg}  {res['config']}")
        timed = {k: v for k, v in results.items() if "skip_8" in v and k != "old"}
        fastest = min(timed, key=lambda k: (timed[k]["skip_8"], k) if not b.smoke else (0, k), default=None)
        for vname in dict.fromkeys(("old", fastest, "fused-1")):  # fused-1: the fewest graph nodes
            if vname is None or vname not in results or "skip_8" not in results[vname]:
                continue
            if not b.time_left(f"t={tokens} skip vs clamped {vname}", need=4.0):
                break
            pdl = variants[vname].get("pdl", False)
            conf = {gm: check_gemm_config(variants[vname][gm]) for gm in GEMMS}
            res = results[vname]
            try:
                res.update(layer_times(b, conf, (w13, s13, w2, s2), tokens, E, H, I, xs, gen,
                                       actives=(8, 2, 0), clamp=True, pdl=pdl))
            except Exception as e:
                res["status"] = f"error {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                continue
            for a in (8, 2, 0):
                b.log(f"t={tokens:3d} layer {vname:15s} {a}/8 active: skip {res[f'skip_{a}']:8.2f} us  "
                      f"clamped {res[f'clamped_{a}']:8.2f} us  {res[f'clamped_{a}'] / res[f'skip_{a}']:6.2f}x"
                      f"  err {res[f'err_{a}']:.1e}")
        layer_rows += results.values()
        checks += [dict(tokens=tokens, variant=k, active=a, err=v[f"err_{a}"], ok=v[f"err_{a}"] < TOL)
                   for k, v in results.items() for a in (8, 2, 0) if f"err_{a}" in v]
    return gemm_rows, layer_rows, checks


def layer_times(b, conf, model, tokens, E, H, I, xs, gen, actives, clamp, pdl=False):
    """Per active count: the replay check of one capture (inputs changed, buffers NaN-poisoned before
    each replay, compared with the reference), then skip (and clamped) timings of reps launches."""
    dev = b.device
    w13, s13, w2, s2 = model
    res = {}
    for a in actives:
        sets = [routes(tokens, E, a, gen, dev) for _ in range(b.reps)]
        bufs = [layer_buffers(tokens, TOP_K, H, I, torch.bfloat16, conf, dev) for _ in range(b.reps)]
        x = xs[0].clone()
        ids, rw = (t.clone() for t in sets[0])
        decode_moe_into(x, *model, rw, ids, conf, bufs[0], pdl=pdl)  # compile outside the capture
        b.sync()
        if b.smoke:
            graph = None
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                decode_moe_into(x, *model, rw, ids, conf, bufs[0], pdl=pdl)
        errs = []
        for i in range(min(2, b.reps)):  # replay with changed routing and inputs, poisoned buffers
            ids.copy_(sets[i][0])
            rw.copy_(sets[i][1])
            x.copy_(xs[i] * (1 + i))
            for t in bufs[0].values():
                t.fill_(float("nan"))
            if graph is not None:
                graph.replay()
            else:
                decode_moe_into(x, *model, rw, ids, conf, bufs[0], pdl=pdl)
            b.sync()
            ref = fp8_decode_moe_reference(x, w13, s13, w2, s2, rw, ids).float()
            out = bufs[0]["out"].float()
            exact_zero = torch.equal(out, torch.zeros_like(out))
            errs.append(rel(out, ref) if a else (0.0 if exact_zero else float("inf")))
        res[f"err_{a}"] = max(errs)
        if res[f"err_{a}"] >= TOL:
            raise RuntimeError(f"layer check failed at {a}/8 active: error {res[f'err_{a}']:.2e}")
        paths = [("skip", sets)]
        if clamp:  # the same routing without a skip path: inactive routes read slot 0 with weight 0
            paths.append(("clamped", [(torch.where(i < 0, torch.zeros_like(i), i),
                                       torch.where(i < 0, torch.zeros_like(w), w)) for i, w in sets]))
        for path, ss in paths:
            def call(i, ss=ss, bufs=bufs):
                decode_moe_into(xs[i], *model, ss[i][1], ss[i][0], conf, bufs[i], pdl=pdl)
            res[f"{path}_{a}"] = b.time_graph(call)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no graphs (CPU interpreter)")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds; no new work starts after it")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--reps", type=int, default=8, help="launches per graph, each with its own routing")
    ap.add_argument("--iters", type=int, default=20, help="graph replays timed")
    args = ap.parse_args()
    b = Bench(args)
    if not b.smoke:
        import triton

        b.log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    t0 = time.time()
    gemm_rows, layer_rows, checks = run(b, args)
    b.log(f"[done in {time.time() - t0:.0f}s; skipped: {b.skipped or 'nothing'}]")
    (b.out / "fp8_decode.json").write_text(json.dumps(
        dict(gemm=gemm_rows, layer=layer_rows, checks=checks, skipped=b.skipped), indent=1, default=str))
    b.log("\nper GEMM (us, % of roofline): old = the earlier best, new = fastest variant of this run, "
          "+pdl = new with programmatic dependent launch, kern = new without its A_FP8 2 split launch")
    b.log(f"{'tok':>3s} {'gemm':7s} {'floor':>6s} {'old us':>7s} {'old%':>5s} {'new us':>7s} {'new%':>5s} "
          f"{'+pdl us':>7s} {'kern us':>7s}  new config")
    for t in sorted({r["tokens"] for r in gemm_rows}):
        for g in GEMMS:
            rows = [r for r in gemm_rows if r["tokens"] == t and r["gemm"] == g and "us" in r]
            old = next((r for r in rows if r["kind"] == "old"), None)
            new = min((r for r in rows if r["kind"] == "new"), key=lambda r: r["us"], default=None)
            pdl, kern = (next((f"{r['us']:7.2f}" for r in rows if r["kind"] == k), f"{'-':>7s}")
                         for k in ("pdl", "kern"))
            if old and new:
                b.log(f"{t:3d} {g:7s} {old['floor_us']:6.2f} {old['us']:7.2f} {old['roofline']:5.0%} "
                      f"{new['us']:7.2f} {new['roofline']:5.0%} {pdl} {kern}  {new['config']}")
    b.log("\nwhole layer (us; skip / clamped at 8/8, 2/8, 0/8 active; x = clamped / skip)")
    b.log(f"{'tok':>3s} {'variant':15s} {'8/8':>7s} {'roof':>5s} {'x 8/8':>6s} {'x 2/8':>6s} {'x 0/8':>6s} "
          f"{'skip0':>6s}")
    for r in layer_rows:
        if "skip_8" not in r:
            continue
        xs = [f"{r[f'clamped_{a}'] / r[f'skip_{a}']:6.2f}" if f"clamped_{a}" in r else f"{'-':>6s}"
              for a in (8, 2, 0)]
        s0 = f"{r['skip_0']:6.2f}" if "skip_0" in r else f"{'-':>6s}"
        b.log(f"{r['tokens']:3d} {r['variant']:15s} {r['skip_8']:7.2f} {r['floor_us'] / r['skip_8']:5.0%} "
              f"{' '.join(xs)} {s0}")
    for r in gemm_rows:
        if r["gemm"] == "align_routes":
            b.log(f"routing step t={r['tokens']:3d} {r['config']:12s} {r['us']:7.2f} us  same: {r['same']}")
    failed = [c for c in checks if not c["ok"]] + [r for r in layer_rows if "status" in r]
    bad_gemms = [f"t={r['tokens']} {r['gemm']} {r['config']}: {r['status']}"
                 for r in gemm_rows if "status" in r]
    b.log(f"GEMM variants failed or inaccurate: {len(bad_gemms)}" + "".join(f"\n  {m}" for m in bad_gemms))
    b.log(f"layer checks (graph replays, poisoned buffers): {sum(c['ok'] for c in checks)} ok of "
          f"{len(checks)}; layer variants failed: {len(failed)}")
    b.logf.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
