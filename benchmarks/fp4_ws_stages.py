"""Where the warp-specialized FP4 kernel's time goes: the tables' pick at one dense point, timed as shipped
and with one stage of its decode partition left out, the difference being that stage's cost on the critical
path.
Each variant is ``gluon_ws.py`` with one line replaced, built as a module of its own and launched through the
layer's own launcher (``gluon_gemm``), so everything else is the shipped code. The left-out variants compute
wrong numbers on purpose; their error is printed, not checked. Stages:

- ``rowmax``: the per-tile pass over the N tile's scale rows (their largest code, for the fp8 re-basing);
- ``scales``: the per-chunk load of the group scales (the chunk reuses the tile's first scales);
- ``decode``: the LUT decode (the packed words are stored as they are; the scale loads it fed go too);
- ``rescale``: the MMA warps' per-chunk promotion (each 128-K product times its activation scale, added to
  the accumulator on the CUDA cores); ``mma chain`` also lets the wgmma accumulate in place, as a GEMM
  whose activation scale is one per row (applied once in the epilogue) could.

Times: ``triton.testing.do_bench`` (L2 cleared between runs), median ms. Writes ws_stages.json under --out.
``--compile-only`` builds every variant for sm_90 without a GPU (a check of the replaced lines).

    PYTHONPATH=. python benchmarks/fp4_ws_stages.py --out $OUT/ws \\
        --point deepseek-v4-flash:2:fp4_prefill.gate_up:24576 --point gpt-oss-120b:1:fp4_prefill.gate_up:24576
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import tempfile
from pathlib import Path

import torch
import triton

import moetune.kernels.fp4_prefill.gluon_gemm as launcher
import moetune.kernels.fp4_prefill.gluon_ws as ws
from moetune.models import get_model
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config

_ROWMAX = "rmax = row_max_scale(ws_rows, num_k, S2, BN)"
_SCALES = "s_next = gl.load(ws_rows + gl.minimum(k + 1, num_k - 1) * (CHUNK // 32)).to(gl.int32)"
_DECODE = "decode_words(words, s, rmax, BN)"
_RESCALE = "acc += part * xs[:, None]"
_CHAIN = [(_RESCALE, "acc = part"), ("zero, use_acc=False, is_async=True)", "acc, is_async=True)")]
_NO_ROWMAX = (_ROWMAX, "rmax = gl.full([BN, 1], 127, gl.int32, S2)")
VARIANTS = {
    "shipped": [],
    "no rowmax": [_NO_ROWMAX],
    "no scales": [(_SCALES, "s_next = s")],
    "no rowmax, no scales": [_NO_ROWMAX, (_SCALES, "s_next = s")],
    "no decode": [(_DECODE, "gl.join(words, words)")],
    "no rescale": [(_RESCALE, "acc += part")],
    "mma chain": _CHAIN,
    "mma chain, no rowmax, no scales": [*_CHAIN, _NO_ROWMAX, (_SCALES, "s_next = s")],
}


def variant_kernel(lines: list[tuple[str, str]], folder: Path):
    """``fp4_wgmma_ws_kernel`` of gluon_ws.py with each (old, new) of ``lines`` replaced (a file of its own:
    the JIT reads its functions' source)."""
    text = inspect.getsource(ws)
    for old, new in lines:
        if text.count(old) != 1:
            raise SystemExit(f"{old!r} is not once in gluon_ws.py")
        text = text.replace(old, new)
    path = folder / f"ws_{len(list(folder.iterdir()))}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fp4_wgmma_ws_kernel


@contextlib.contextmanager
def launched(lines: list[tuple[str, str]], folder: Path):
    """The layer's launcher runs the kernel with ``lines`` replaced inside the block (the shipped one where
    there are none), the shipped one after it."""
    shipped = ws.fp4_wgmma_ws_kernel
    launcher.fp4_wgmma_ws_kernel = variant_kernel(lines, folder) if lines else shipped
    try:
        yield
    finally:
        launcher.fp4_wgmma_ws_kernel = shipped


def _point(point: str):
    model, tp, kernel, routes = point.split(":")
    spec = get_spec(kernel)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(model), int(tp)))
    problem = spec.problem(shape, -(-int(routes) // shape["top_k"]))
    config = {**spec.default, **pick_config(kernel, shape, problem.routes, device="NVIDIA H200")}
    if config["IMPL"] != "gluon" or not config["DECODE_WARPS"]:
        raise SystemExit(f"{point}: the tables pick {config}, not the warp-specialized kernel")
    return spec, problem, config


def compile_only(point: str, folder: Path) -> None:
    spec, problem, config = _point(point)
    a_div = problem.shape["top_k"] if spec.gemm == "gate_up" else 1
    for name in VARIANTS:
        with launched(VARIANTS[name], folder):
            k = launcher.compile_for_sm90(config, a_div=a_div, k=problem.shape["K"], n=problem.shape["N"])
        print(f"{point} | {name} | compiled, {k.metadata.shared} B of shared memory", flush=True)


def measure(point: str, folder: Path) -> list[dict]:
    spec, problem, config = _point(point)
    inputs = spec.make_inputs(problem, "cuda", 0)
    expected = spec.reference(inputs)
    rows = []
    for name in VARIANTS:
        with launched(VARIANTS[name], folder):
            spec.run(inputs, config)
            spec.collect(inputs, config)
            err = spec.error(inputs.outputs, expected)
            ms = triton.testing.do_bench(lambda: spec.run(inputs, config), warmup=50, rep=300,
                                         return_mode="median")
        rows.append({"point": point, "variant": name, "ms": ms, "error": err,
                     "tflops": spec.flops(problem) / ms / 1e9})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--point", action="append", required=True, help="model:tp:kernel:routes")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compile_only:
        with tempfile.TemporaryDirectory() as tmp:
            for point in args.point:
                compile_only(point, Path(tmp))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in args.point:
            rows += measure(point, Path(tmp))
    (args.out / "ws_stages.json").write_text(json.dumps(rows, indent=1))
    print("| point | variant | ms | x shipped | TFLOP/s | error |\n|---|---|---:|---:|---:|---:|")
    base = {r["point"]: r["ms"] for r in rows if r["variant"] == "shipped"}
    for r in rows:
        print(f"| {r['point']} | {r['variant']} | {r['ms']:.4f} | {r['ms'] / base[r['point']]:.3f} "
              f"| {r['tflops']:.0f} | {r['error']:.2g} |")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
