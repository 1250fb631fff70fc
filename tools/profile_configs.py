"""Run given configs of one op a few times each, checked first, for a profiler to capture (H200).

Why ``UNPACK=lut`` issues fewer instructions than ``halves`` at BLOCK_SIZE_M 128 and still runs slower
(docs/kernels/fp4_prefill.md) needs hardware counters: stall reasons, shared-memory bank
conflicts. ``ncu`` reads them on the Firecracker H200 machines. This script makes the problem once,
checks each config against the reference (so a profile never describes a wrong kernel), then launches
each ``--launches`` times with NVTX ranges named after the config. Profile it like:

    ncu --clock-control none --nvtx --nvtx-include 'cfg0/' --nvtx-include 'cfg1/' --launch-skip 1 \\
        --launch-count 2 --section SpeedOfLight --section WarpStateStats \\
        --section MemoryWorkloadAnalysis --section SourceCounters -o $OUT/fp4 \\
        python tools/profile_configs.py -k fp4_prefill.gate_up -m deepseek-v4-flash --tp 2 \\
        --routes 24576 --config "$HALVES" --config "$LUT"

with HALVES='{"BLOCK_SIZE_M":128,"BLOCK_SIZE_N":64,"BLOCK_SIZE_K":128,"DECODE":"fp8","UNPACK":"halves"}'
and LUT the same with "UNPACK":"lut".

Missing keys take the op's default values.
"""

from __future__ import annotations

import argparse
import json

import torch

from moetune.models import get_model
from moetune.specs.registry import get_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", "--kernel", required=True, help="one op, e.g. fp4_prefill.gate_up")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", type=int, help="decode ops")
    ap.add_argument("--routes", type=int, help="prefill ops: routes (tokens = routes / top_k)")
    ap.add_argument("--config", action="append", required=True, help="a config as JSON (repeat)")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: the Triton interpreter (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    spec = get_spec(args.kernel)
    model = get_model(args.model)
    shape = spec.shape_from_model(model, args.tp)
    tokens = args.tokens if args.tokens is not None else args.routes // shape["top_k"]
    problem = spec.problem(shape, tokens)
    inputs = spec.make_inputs(problem, args.device, seed=0)
    gpu = args.device != "cpu"
    expected = spec.reference(inputs)
    for i, text in enumerate(args.config):
        config = {**spec.default, **json.loads(text)}
        spec.check_config(config)
        spec.poison(inputs)
        spec.run(inputs, config)
        spec.collect(inputs, config)
        err = spec.error(inputs.outputs, expected)
        print(f"cfg{i}: error {err:.3g} ({'ok' if spec.passes(err) else 'INACCURATE'}) {json.dumps(config)}",
              flush=True)
        if not spec.passes(err):
            continue
        for _ in range(args.launches):
            if gpu:
                torch.cuda.nvtx.range_push(f"cfg{i}")
            spec.run(inputs, config)
            if gpu:
                torch.cuda.nvtx.range_pop()
        if gpu:
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
