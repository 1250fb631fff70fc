"""Where the Gluon FP4 kernels' time goes: the tables' pick at one point, timed as shipped and with one stage
left out at a time, the difference being that stage's cost on the critical path. Three kernel modules: the
warp-specialized one (``ws``: DECODE_WARPS picks, dense points), the SWAP_AB 1 ring (``ring``: sparse
points) and the SWAP_AB 0 loops (``smem``), whichever the pick runs.
Each variant is the kernel's module with one line replaced, built as a module of its own and launched
through the layer's own launcher (``gluon_gemm``), so everything else is the shipped code. The left-out
variants compute wrong numbers on purpose; their error is printed, not checked. Stages:

- ``rowmax pass``: the row maxima (for the fp8 re-basing) made by a pass over each tile's scale rows, as
  when ``fp4_prefill_moe`` is not given them, instead of one load of those stored with the weights;
- ``scales``: the per-chunk load of the group scales (the chunk reuses the tile's first scales);
- ``decode``: the LUT decode (the packed words are stored as they are; the scale loads it fed go too);
- ``rescale``: the MMA warps' per-chunk promotion (each 128-K product times its activation scale, added to
  the accumulator on the CUDA cores); ``mma chain`` also lets the wgmma accumulate in place, as a GEMM
  whose activation scale is one per row (applied once in the epilogue) could;
- ``w copies``, ``x copies``: the decode partition's cp.async copies of the packed weights or of the
  activations after the tile's first chunks (the ring keeps what it holds).

Times: ``triton.testing.do_bench`` (L2 cleared between runs), median ms. Writes stages.json under --out.
``--set KEY=VALUE`` adds the pick with a design switch set (checked against the reference, not wrong on
purpose), ``--only shipped`` leaves the stage variants out. ``--compile-only`` builds every variant for sm_90
without a GPU (a check of the replaced lines).

    PYTHONPATH=. python benchmarks/fp4_stages.py --out $OUT/stages \\
        --point deepseek-v4-flash:2:fp4_prefill.gate_up:24576 --point gpt-oss-120b:1:fp4_prefill.gate_up:768
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
import moetune.kernels.fp4_prefill.gluon_ring as ring
import moetune.kernels.fp4_prefill.gluon_smem as smem
import moetune.kernels.fp4_prefill.gluon_ws as ws
from moetune.models import get_model
from moetune.specs.registry import get_spec
from moetune.tables.picker import pick_config


def _pass(indent: int, flag: str = "HAS_SMAX") -> list[tuple[str, str]]:
    """The kernel's ``tile_row_max`` call (its flag on a line of its own) made to take the pass over the
    scales instead of the stored row maxima the spec gives."""
    return [(f"EVEN_N,\n{' ' * indent}{flag})", f"EVEN_N,\n{' ' * indent}False)")]



_SCALES = "s_next = gl.load(ws_rows + gl.minimum(k + 1, num_k - 1) * (CHUNK // 32)).to(gl.int32)"
_DECODE = "decode_words(words, s, rmax, BN)"
_RESCALE = "acc += part * xs[:, None]"
_CHAIN = [(_RESCALE, "acc = part"), ("zero, use_acc=False, is_async=True)", "acc, is_async=True)")]
_W_COPY = "_w_copy(w_ring, w_full, w_src, cn, k + LOOK, expert, pid_n, LOOK, BN, W_TMA)"
_W_WAIT = "mbarrier.wait(w_full.index(c % LOOK), (c // LOOK) & 1)"  # (W_TMA: no copy, no wait for it)
_X_COPY = "x_copy(x_buf, cn, k + LOOK, x_rows, cols_x, row_ok_x, fresh, NBUF, A_RESIDENT)"
# per kernel module: the module, the launcher's names for its kernels, and its variants (lines replaced)
KERNELS = {
    "ws": (ws, "fp4_wgmma_ws_kernel", {
        "shipped": [],
        "rowmax pass": _pass(28, "HAS_SMAX and not A_RESIDENT"),
        "no scales": [(_SCALES, "s_next = s")],
        "no decode": [(_DECODE, "gl.join(words, words)")],
        "no rescale": [(_RESCALE, "acc += part")],
        "mma chain": _CHAIN,
        "mma chain, no scales": [*_CHAIN, (_SCALES, "s_next = s")],
        "no w copies": [(_W_COPY, "pass"), (_W_WAIT, "pass")],
        "no x copies": [(_X_COPY, "pass")],
        "no copies": [(_W_COPY, "pass"), (_W_WAIT, "pass"), (_X_COPY, "pass")],
    }),
    "ring": (ring, "fp4_wgmma_kernel", {
        "shipped": [],
        "rowmax pass": _pass(28),
    }),
    "smem": (smem, "fp4_wgmma_smem_kernel fp4_wgmma_halves_kernel", {
        "shipped": [],
        "rowmax pass": _pass(24),
    }),
}


def variant_kernels(kernel: str, lines: list[tuple[str, str]], folder: Path) -> list:
    """KERNELS[kernel]'s kernels with each (old, new) of ``lines`` replaced in their module (a file of its
    own: the JIT reads its functions' source), each old text wherever it is."""
    module, names, _ = KERNELS[kernel]
    text = inspect.getsource(module)
    for old, new in lines:
        if old not in text:
            raise SystemExit(f"{old!r} is not in {module.__name__}")
        text = text.replace(old, new)
    path = folder / f"{kernel}_{len(list(folder.iterdir()))}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    variant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variant)
    return [getattr(variant, name) for name in names.split()]


@contextlib.contextmanager
def launched(kernel: str, lines: list[tuple[str, str]], folder: Path):
    """The layer's launcher runs KERNELS[kernel]'s kernels with ``lines`` replaced inside the block (the
    shipped ones where there are none), the shipped ones after it."""
    module, names, _ = KERNELS[kernel]
    shipped = [getattr(module, name) for name in names.split()]
    for name, fn in zip(names.split(), variant_kernels(kernel, lines, folder) if lines else shipped,
                        strict=True):
        setattr(launcher, name, fn)
    try:
        yield
    finally:
        for name, fn in zip(names.split(), shipped, strict=True):
            setattr(launcher, name, fn)


def _point(point: str):
    model, tp, kernel, routes = point.split(":")
    spec = get_spec(kernel)
    shape = spec.normalize_shape(spec.shape_from_model(get_model(model), int(tp)))
    problem = spec.problem(shape, -(-int(routes) // shape["top_k"]))
    config = {**spec.default, **pick_config(kernel, shape, problem.routes, device="NVIDIA H200")}
    if config["IMPL"] != "gluon":
        raise SystemExit(f"{point}: the tables pick {config}, not a Gluon kernel")
    return spec, problem, config, "ws" if config["DECODE_WARPS"] else "ring" if config["SWAP_AB"] else "smem"


def _variants(kernel: str, config: dict, sets: list[str]):
    """(name, lines replaced, config) of each variant: the kernel's, then the pick with each ``--set``
    KEY=VALUE (a design switch of the shipped kernel, checked against the reference like the pick)."""
    for name, lines in KERNELS[kernel][2].items():
        yield name, lines, config
    for item in sets:
        key, value = item.split("=")
        yield f"set {item}", [], {**config, key: int(value) if value.lstrip("-").isdigit() else value}


def compile_only(point: str, folder: Path, sets: list[str]) -> None:
    spec, problem, config, kernel = _point(point)
    a_div = problem.shape["top_k"] if spec.gemm == "gate_up" else 1
    for name, lines, cfg in _variants(kernel, config, sets):
        with launched(kernel, lines, folder):
            k = launcher.compile_for_sm90(cfg, a_div=a_div, k=problem.shape["K"], n=problem.shape["N"],
                                          row_max=True, out_dtype=cfg["OUT_DTYPE"])
        print(f"{point} | {name} | compiled, {k.metadata.shared} B of shared memory", flush=True)


def measure(point: str, folder: Path, sets: list[str]) -> list[dict]:
    spec, problem, pick, kernel = _point(point)
    inputs = spec.make_inputs(problem, "cuda", 0)
    expected = spec.reference(inputs)
    rows = []
    for name, lines, config in _variants(kernel, pick, sets):
        with launched(kernel, lines, folder):
            spec.run(inputs, config)
            spec.collect(inputs, config)
            err = spec.error(inputs.outputs, expected)
            ms = triton.testing.do_bench(lambda config=config: spec.run(inputs, config), warmup=50, rep=300,
                                         return_mode="median")
        rows.append({"point": point, "variant": name, "ms": ms, "error": err,
                     "tflops": spec.flops(problem) / ms / 1e9})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--point", action="append", required=True, help="model:tp:kernel:routes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="also the pick with this config key set (a variant of its own; repeatable)")
    ap.add_argument("--only", choices=["shipped"], help="of the stage variants, only the shipped kernel")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.only:
        for _, _, variants in KERNELS.values():
            for name in [n for n in variants if n != "shipped"]:
                del variants[name]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compile_only:
        with tempfile.TemporaryDirectory() as tmp:
            for point in args.point:
                compile_only(point, Path(tmp), args.set)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in args.point:
            rows += measure(point, Path(tmp), args.set)
    (args.out / "stages.json").write_text(json.dumps(rows, indent=1))
    print("| point | variant | ms | x shipped | TFLOP/s | error |\n|---|---|---:|---:|---:|---:|")
    base = {r["point"]: r["ms"] for r in rows if r["variant"] == "shipped"}
    for r in rows:
        print(f"| {r['point']} | {r['variant']} | {r['ms']:.4f} | {r['ms'] / base[r['point']]:.3f} "
              f"| {r['tflops']:.0f} | {r['error']:.2g} |")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
