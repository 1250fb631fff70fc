"""Compile moetune's Triton kernels for sm_90 on a machine with no GPU (Triton's bundled ptxas), in a
process without the interpreter, so CPU tests can check what the GPU would run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import hashlib, importlib, inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

out = []
for job in json.loads(sys.argv[1]):
    module, name = job["kernel"].rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    params = list(inspect.signature(fn.fn).parameters)
    const = job["const"]
    sig = {p: "constexpr" if p in const else job["types"].get(p, "i32") for p in params}
    attrs = {(params.index(k),): [["tt.divisibility", 16]] for k in job.get("aligned", [])}
    src = ASTSource(fn, sig, constexprs={(params.index(k),): v for k, v in const.items()}, attrs=attrs)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=job["options"])
    except (FileNotFoundError, RuntimeError) as e:
        print(json.dumps({"skip": str(e)}))
        sys.exit(0)
    out.append({"cubin": hashlib.sha1(k.asm["cubin"]).hexdigest(), "ptx": k.asm["ptx"]})
print(json.dumps({"results": out}))
"""


def compile_sm90(jobs: list[dict]) -> list[dict] | str:
    """Per job ({"kernel": "module.name", "const": {...}, "types": {arg: "*bf16", ...}, "options":
    {"num_warps": .., ...}, optionally "aligned": [args the launcher would find divisible by 16]};
    arguments not named are i32; a stride the launcher would see as 1 goes in "const", as Triton
    specializes it): {"cubin": sha1, "ptx": text}. A string says why this Triton cannot compile for
    sm_90 here (the caller skips)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(jobs)], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    reply = json.loads(run.stdout.strip().splitlines()[-1])
    return reply.get("skip") or reply["results"]


_PARAMS = r"""
import importlib, json, sys
out = []
for path in json.loads(sys.argv[1]):
    module, name = path.rsplit(".", 1)
    (p,) = [p for p in getattr(importlib.import_module(module), name).params if p.name == sys.argv[2]]
    out.append([p.is_constexpr, p.do_not_specialize])
print(json.dumps(out))
"""


def param_flags(kernels: list[str], param: str) -> list[tuple[bool, bool]]:
    """(is constexpr, is never specialized) of ``param`` in each kernel ("module.name"), as Triton's JIT
    sees them on a GPU (the interpreter's kernels do not say)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _PARAMS, json.dumps(kernels), param], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return [tuple(f) for f in json.loads(run.stdout.strip().splitlines()[-1])]
