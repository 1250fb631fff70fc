"""What a spec's dominated designs (``KernelSpec.dominated``) cost, by the stores' own measurements.

For every point (kernel, shape, density, routing) that the stores measured on one device kind, compare the
best time of all its ok rows with the best time of the rows a sweep would still search. Prints, per reason
the spec gives, how many points measured such a design and at how many it came within ``--near`` of the
point's best; then the loss (searched best / overall best) over the points, worst first. Runs on the CPU.

    python tools/dominated_designs.py --family fp8_decode --arch sm_90 --device "NVIDIA H200"
"""

from __future__ import annotations

import argparse
import glob
import json

import pandas as pd

from moetune.device import DeviceInfo
from moetune.specs.registry import get_spec
from moetune.tuner.store import read_frame

_POINT = ["kernel", "shape", "tokens", "routes", "active_fraction", "routing"]


def load(paths: list[str], family: str, device_name: str) -> pd.DataFrame:
    frames = []
    for path in paths:
        try:
            frame = read_frame(path, "--stores")
        except (ValueError, OSError):
            continue  # not a moetune store
        frames.append(frame[(frame.status == "ok") & frame.kernel.str.startswith(f"{family}.")
                            & (frame.device_name == device_name)])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=_POINT + ["config"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="fp8_decode")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--device", default="NVIDIA H200", help="device_name of the rows to read")
    ap.add_argument("--stores", nargs="+", help="default: every data/**/*.sqlite[.gz]")
    ap.add_argument("--near", type=float, default=0.03, help="within this fraction of a point's best")
    args = ap.parse_args()
    paths = args.stores or sorted(glob.glob("data/**/*.sqlite", recursive=True)
                                  + glob.glob("data/**/*.sqlite.gz", recursive=True))
    df = load(paths, args.family, args.device)
    if df.empty:
        raise SystemExit(f"no ok {args.family} rows of {args.device!r} in {len(paths)} store(s)")
    device = DeviceInfo(args.device, args.arch, 0, 0, 0, True)  # dominated() reads the arch only
    df["reason"] = [get_spec(k).dominated(json.loads(c), device, json.loads(s)) or ""
                    for k, c, s in zip(df.kernel, df.config, df["shape"], strict=True)]
    df["best"] = df.groupby(_POINT).time_ms.transform("min")
    df["near"] = df.time_ms <= (1 + args.near) * df.best
    print(f"{len(df)} ok rows, {df.groupby(_POINT).ngroups} points, {len(paths)} store(s)\n")
    per = df[df.reason != ""].groupby(["reason", *_POINT]).near.any().groupby("reason").agg(["sum", "count"])
    per.columns = [f"points within {args.near:.0%}", "points measured"]
    print(per.to_string() if len(per) else "no stored row is of a dominated design", "\n")
    kept = df[df.reason == ""].groupby(_POINT).time_ms.min()
    loss = (kept / df.groupby(_POINT).time_ms.min()).dropna().sort_values(ascending=False)
    print(f"loss of the searched best over all rows' best, {len(loss)} points: worst {loss.max():.4f}, "
          f"over 1%: {(loss > 1.01).sum()}, over 3%: {(loss > 1.03).sum()}")
    print(loss.head(8).to_string())


if __name__ == "__main__":
    main()
