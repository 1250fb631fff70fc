"""Where a kernel's warps stall, per SASS instruction, from an Nsight Compute report with SourceCounters:
the busiest instructions by warp-state samples and the samples per address range (``--ranges``, e.g. a
warp-specialized kernel's partitions). Reads ``ncu -i REPORT --page source --csv --print-source sass``.

    ncu -i k.ncu-rep --page source --csv --print-source sass > k.csv
    python tools/ncu_hotspots.py k.csv --top 40 --ranges 0x190-0x4420 0x49b0-0x76f0

The ranges of a warp-specialized kernel's partitions: between its ``USETMAXREG`` instructions (the SASS that
``ncu`` prints, or cuobjdump's of the same cubin).
"""

from __future__ import annotations

import argparse
import io

import pandas as pd


def read(path: str) -> pd.DataFrame:
    text = open(path).read()
    start = text.find('"Address"')  # ncu prints its own lines before the table
    frame = pd.read_csv(io.StringIO(text[start if start >= 0 else 0:]))
    frame["addr"] = frame["Address"].map(lambda a: int(str(a), 16))
    return frame


def samples_column(frame: pd.DataFrame) -> str:
    return next(c for c in frame.columns if c.startswith("Warp Stall Sampling (All"))


def range_totals(frame: pd.DataFrame, ranges: list[str], relative: bool = True) -> list[tuple[str, int, int]]:
    """(range, samples, instructions) for each LO-HI (hex) range; with ``relative`` the addresses count from
    the kernel's first instruction (ncu prints absolute ones), as cuobjdump's SASS does."""
    base = frame.addr.min() if relative else 0
    col = samples_column(frame)
    out = []
    for text in ranges:
        lo, hi = (int(x, 16) + base for x in text.split("-"))
        part = frame[(frame.addr >= lo) & (frame.addr <= hi)]
        out.append((text, int(part[col].sum()), len(part)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--ranges", nargs="*", default=[],
                    help="address ranges LO-HI (hex, from the kernel's first instruction) to total")
    args = ap.parse_args()
    frame = read(args.csv)
    samples = samples_column(frame)
    print("columns:", ", ".join(frame.columns))
    total = frame[samples].sum()
    print(f"{samples}: {total}")
    for text, n, count in range_totals(frame, args.ranges):
        print(f"{text}: {n} samples ({n / total:.1%}), {count} instructions")
    shown = [c for c in frame.columns if c in ("Address", "Source", samples)
             or c.startswith("Warp Stall Sampling (Not") or c.startswith("Instructions Executed")]
    top = frame.nlargest(args.top, samples)[shown]
    with pd.option_context("display.width", 250, "display.max_colwidth", 70, "display.max_rows", 500):
        print(top.to_string(index=False))


if __name__ == "__main__":
    main()
