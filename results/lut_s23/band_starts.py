"""The SWAP_AB 1 band of a DeepSeek-V4-Flash TP 2 table: prints its route counts (comma-separated) for
`moetune sweep --routes` and writes the band's distinct picks with RING_SPLIT 1 (the 16-row ring tile
also at MAXNREG 96) to a JSON start file.

    python results/lut_s23/band_starts.py down /root/starts_down.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLES = {"gate_up": "configs/sm_90/fp4_prefill.gate_up/E256_N2048_K4096_topk6.json",
          "down": "configs/sm_90/fp4_prefill.down/E256_N4096_K1024_topk6.json"}


def main(gemm: str, start_file: str) -> None:
    entries = json.loads(Path(TABLES[gemm]).read_text())["entries"]
    band = [e for e in entries if e["config"].get("IMPL") == "gluon" and e["config"].get("SWAP_AB")]
    starts = {}
    for e in band:
        split = {**e["config"], "RING_SPLIT": 1}
        variants = [{**split, "MAXNREG": 0}]
        if split["BLOCK_SIZE_M"] == 16 and not split["A_RESIDENT"]:
            variants.append({**split, "MAXNREG": 96})
        for c in variants:
            starts[json.dumps(c, sort_keys=True)] = c
    Path(start_file).write_text(json.dumps(list(starts.values())))
    print(",".join(str(e["routes"]) for e in band))


if __name__ == "__main__":
    main(*sys.argv[1:])
