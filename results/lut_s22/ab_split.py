"""RING_SPLIT and MAXNREG 96 against the shipped picks, in the sweep's own harness on one machine: for each
point, the committed table's pick with RING_SPLIT 0 and 1 (and with MAXNREG 96 where the pick is the 16-row
ring tile; at down 6144 also its GROUP_SIZE_M 1 and A_RESIDENT twins and the 16-row ring tile), measured by
`moetune sweep --start` (coordinate, the budget the starts and the shipped default, which a sweep times
first, so only they are timed), RUNS times, every other run in the reverse order. Stores outside $OUT (a
warm machine keeps them: removed first), then into $OUT/stores.tar.gz; the table of times last, also as
$OUT/ab.md.

    OUT=/tmp/out PYTHONPATH=$PWD python results/lut_s22/ab_split.py down:6144 down:1536 gate_up:6144

Points: GEMM:ROUTES of DeepSeek-V4-Flash at TP 2 (top_k 6: tokens = routes / 6).
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

RUNS = 2
TABLES = {"gate_up": "configs/sm_90/fp4_prefill.gate_up/E256_N2048_K4096_topk6.json",
          "down": "configs/sm_90/fp4_prefill.down/E256_N4096_K1024_topk6.json"}


def starts(gemm: str, routes: int) -> list[dict]:
    """The table's pick at the point and its variants (see the module's docstring)."""
    doc = json.loads(Path(TABLES[gemm]).read_text())
    pick = next(e["config"] for e in doc["entries"] if e["tokens"] == routes // 6)
    if pick.get("IMPL") != "gluon" or not pick.get("SWAP_AB"):
        raise SystemExit(f"{gemm} {routes}: the pick is not a Gluon SWAP_AB 1 config: {pick}")
    bases = [pick]
    if (gemm, routes) == ("down", 6144):
        bases += [{**pick, "GROUP_SIZE_M": 1}, {**pick, "A_RESIDENT": 1 - pick["A_RESIDENT"]},
                  {**pick, "BLOCK_SIZE_M": 16, "A_RESIDENT": 0}]
    out = []
    for base in bases:
        out += [{**base, "RING_SPLIT": 0, "MAXNREG": 0}, {**base, "RING_SPLIT": 1, "MAXNREG": 0}]
        if base["BLOCK_SIZE_M"] == 16 and not base["A_RESIDENT"]:  # five CTAs an SM without a spill (offline)
            out += [{**base, "RING_SPLIT": 0, "MAXNREG": 96}, {**base, "RING_SPLIT": 1, "MAXNREG": 96}]
    return out


def label(c: dict) -> str:
    return (f"BM{c['BLOCK_SIZE_M']} G{c['GROUP_SIZE_M']} {'resident' if c['A_RESIDENT'] else 'ring'}"
            f" split{c.get('RING_SPLIT', 0)}" + (f" r{c['MAXNREG']}" if c.get("MAXNREG") else ""))


def main(points: list[str]) -> None:
    out = Path(os.environ["OUT"])
    for old in glob.glob("/root/s22_*.sqlite*"):
        os.remove(old)
    times: dict[tuple, dict[int, float | str]] = {}
    dbs = []
    for run in range(1, RUNS + 1):
        for point in points:
            gemm, routes = point.split(":")
            configs = starts(gemm, int(routes))
            if run % 2 == 0:
                configs.reverse()
            start = Path(f"/root/s22_start_{gemm}_{routes}_{run}.json")
            start.write_text(json.dumps(configs))
            db = f"/root/s22_{gemm}_{routes}_{run}.sqlite"
            cmd = [sys.executable, "-m", "moetune", "sweep", "--db", db, "--budget", str(len(configs) + 1),
                   "--time-limit", "150", "--quiet", "-m", "deepseek-v4-flash", "--tp", "2",
                   "-k", f"fp4_prefill.{gemm}", "--routes", routes, "--strategy", "coordinate",
                   "--start", str(start)]
            with open(out / "sweeps.log", "a") as log:
                log.write(f"\n### run {run} {point}\n")
                log.flush()
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=200, check=False)
            con = sqlite3.connect(db)
            con.execute("pragma wal_checkpoint(truncate)")
            for t, c, status in con.execute("select time_ms, config, status from measurements"):
                c = json.loads(c)
                if c.get("IMPL") == "gluon":
                    times.setdefault((gemm, int(routes), label(c)), {})[run] = t if status == "ok" else status
            con.close()
            dbs.append(db)
    with tarfile.open(out / "stores.tar.gz", "w:gz") as tar:
        for db in dbs:
            tar.add(db, arcname=Path(db).name)
    runs = range(1, RUNS + 1)
    lines = ["| GEMM | routes | config | " + " | ".join(f"run {r} ms" for r in runs) + " | mean ms |",
             "|---|---:|---|" + "---:|" * (RUNS + 1)]
    for (gemm, routes, name), got in sorted(times.items()):
        cells = [got.get(r, "-") for r in runs]
        ok = [v for v in cells if isinstance(v, float)]
        mean = f"{statistics.mean(ok):.4f}" if len(ok) == RUNS else ""
        text = " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in cells)
        lines.append(f"| {gemm} | {routes} | {name} | {text} | {mean} |")
    (out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
