"""What the FP4 prefill GEMM costs an sm_90 SM, per config, without a GPU: registers, shared memory,
CTAs an SM holds (by each limit), and the SASS that matters (tensor-core, shared-memory, barrier and
byte-permute instructions), compiled with the installed Triton's bundled ptxas; then the K loop's own
instruction count (one trip of the longest backward branch) and its barriers, synchronous global loads
and fp32 multiplies (the accumulator's rescale).

Configs are fp4_prefill configs (JSON objects, as in the tables); missing keys take the default. IMPL "gluon"
configs compile the Gluon kernel (moetune/kernels/fp4_prefill/gluon_gemm.py) as its launcher does. The
compile sees the launcher's specializations: 16-byte aligned pointers and strides, EVEN_K, the
interpreter off. Run it with the Triton the GPU runs (3.6) first on the path, from the repo root:

    PYTHONPATH=/tmp/t36:. python tools/fp4_sm90_resources.py \\
        '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_K": 128, "DECODE": "fp8", "UNPACK": "halves", "num_stages": 3}' \\
        '{"BLOCK_SIZE_M": 128, "BLOCK_SIZE_K": 128, "DECODE": "fp8", "UNPACK": "lut", "num_stages": 3}' \\
        --maxnreg 0 168

``--maxnreg`` also compiles each config under ptxas register caps (what Triton's ``maxnreg`` option
passes): more CTAs an SM against the spills (LDL/STL) they cost. Gluon configs compile with the launcher's
cap (row "launcher") and then each nonzero cap given instead.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from moetune.kernels.fp4_prefill import triton_gemm as fp4_gemm
from moetune.kernels.fp4_prefill.config import normalize_config

SM90_REGS, SM90_SMEM, SM90_THREADS = 65536, 232448, 2048  # per SM; smem: the opt-in limit a CTA may use
_TYPES = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "w_ptr": "*u8", "w_scale_ptr": "*u8", "c_ptr": "*bf16",
          "lut_ptr": "*u32", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_padded_ptr": "*i32"}
_SHOWN = ("QGMMA", "HGMMA", "LDS", "LDSM", "STS", "BAR", "PRMT", "F2FP", "LDL", "STL")
_LOOP_SHOWN = ("BAR", "LDG", "FFMA", "FMUL")  # per K-loop trip: the synchronous loads and the rescale


def compile_config(config: dict, a_div: int, maxnreg: int | None = None) -> triton.compiler.CompiledKernel:
    fn = fp4_gemm.fp4_moe_gemm_kernel
    params = list(inspect.signature(fn.fn).parameters)
    tma = bool(config["W_TMA"])
    const = dict(A_DIV=a_div, GATHERED=config.get("A_LAYOUT") == "gathered",
                 DECODE=fp4_gemm.DECODES[config["DECODE"]], UNPACK=fp4_gemm.UNPACKS[config["UNPACK"]],
                 USE_ASM=fp4_gemm.UNPACKS[config["UNPACK"]] != 0, SWAP_AB=bool(config["SWAP_AB"]),
                 BLOCK_SIZE_M=config["BLOCK_SIZE_M"], BLOCK_SIZE_N=config["BLOCK_SIZE_N"],
                 BLOCK_SIZE_K=config["BLOCK_SIZE_K"], EVEN_K=True, F32_DOT=False, W_TMA=tma,
                 SCALE_AHEAD=bool(config["SCALE_AHEAD"]), A_QUADS=bool(config["A_QUADS"]))
    types = dict(_TYPES)
    if tma:
        types["w_ptr"] = f"tensordesc<u8[1,{config['BLOCK_SIZE_N']},{config['BLOCK_SIZE_K'] // 2}]>"
    sig = {p: "constexpr" if p in const else types.get(p, "i32") for p in params}
    descriptor = {"w_ptr"} if tma else set()
    aligned = [p for p in params if p not in const.keys() | descriptor
               and (p.startswith("stride") or p in ("N", "K") or p.endswith("_ptr"))]
    src = ASTSource(fn, sig, constexprs={(params.index(k),): v for k, v in const.items()},
                    attrs={(params.index(k),): [["tt.divisibility", 16]] for k in aligned})
    options = {"num_warps": config["num_warps"], "num_stages": config["num_stages"]}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def k_loop(sass: str) -> list[str]:
    """The opcodes of the K loop: the instructions the longest backward branch spans."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             re.finditer(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z][^;]*);", sass)]
    spans = [(addr - int(m.group(1), 16), int(m.group(1), 16), addr) for addr, text in lines
             if (m := re.search(r"\bBRA (0x[0-9a-f]+)", text)) and int(m.group(1), 16) < addr]
    _, start, end = max(spans)
    return [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for addr, text in lines
            if start <= addr <= end]


def resources(kernel: triton.compiler.CompiledKernel, warps: int) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    smem = kernel.metadata.shared
    threads = 32 * warps
    by = {"regs": SM90_REGS // (regs * threads), "smem": SM90_SMEM // max(smem, 1),
          "threads": SM90_THREADS // threads}
    opcodes = re.findall(r"\b([A-Z][A-Z0-9]*)(?:\.[A-Z0-9x_]+)* ", sass)
    ops = collections.Counter(op for op in opcodes if op in _SHOWN)
    loop = k_loop(sass)
    in_loop = collections.Counter(loop)
    return {"regs": regs, "smem": smem, "ctas_per_sm": min(by.values()), "limited_by": min(by, key=by.get),
            **{op: ops.get(op, 0) for op in _SHOWN}, "loop": len(loop),
            **{f"loop {op}": in_loop.get(op, 0) for op in _LOOP_SHOWN}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="+", help="fp4_prefill config JSON objects")
    ap.add_argument("--gemm", choices=["gate_up", "down"], default="gate_up")
    ap.add_argument("--top-k", type=int, default=6, help="gate/up's activation row divisor")
    ap.add_argument("--maxnreg", type=int, nargs="+", default=[0],
                    help="ptxas register caps to compile each config with (0: none)")
    args = ap.parse_args()
    rows = []
    for text in args.configs:
        config = normalize_config(json.loads(text), args.gemm)
        if config["IMPL"] == "gluon":  # the Gluon kernel with the launcher's register cap, then the others
            from moetune.kernels.fp4_prefill.gluon_gemm import compile_for_sm90

            for cap in sorted(set(args.maxnreg) | {0}):
                a_div = args.top_k if args.gemm == "gate_up" else 1
                kernel = compile_for_sm90(config, a_div=a_div, maxnreg=cap)
                rows.append({"config": text, "maxnreg": cap or "launcher",
                             **resources(kernel, config["num_warps"])})
            continue
        for cap in args.maxnreg:
            kernel = compile_config(config, args.top_k if args.gemm == "gate_up" else 1, cap)
            rows.append({"config": text, "maxnreg": cap or "-", **resources(kernel, config["num_warps"])})
    cols = [c for c in rows[0] if c != "config"]
    print(f"Triton {triton.__version__}, sm_90\n")
    print("| config | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    for r in rows:
        print(f"| `{r['config']}` | " + " | ".join(str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
