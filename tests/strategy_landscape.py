"""Synthetic tile landscapes with a planted optimum, written as replay data (CSV) for strategy tests."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd

SPACE = {"BLOCK_SIZE_M": (16, 32, 64, 128), "BLOCK_SIZE_N": (32, 64, 128, 256),
         "BLOCK_SIZE_K": (32, 64, 128, 256), "num_warps": (4, 8), "num_stages": (1, 2, 3), "MODE": ("a", "b")}


def landscape(seed: int, density: float, best: dict | None = None, rugged: float = 0.02) -> list[dict]:
    """Rows of one point: a smooth log-space bowl around a density-dependent optimum, ``rugged`` noise,
    shared-memory failures, a few inaccurate configs. ``best`` (if given) is planted: the bowl is
    centred on it and it is 5% below what the bowl says."""
    rng = np.random.default_rng(seed)
    centre = {"BLOCK_SIZE_M": min(7.0, max(4.0, math.log2(max(density, 1)) + 3)), "BLOCK_SIZE_N": 6.3,
              "BLOCK_SIZE_K": 6.8, "num_warps": 2.5, "num_stages": 2.2}
    mode = "a"
    if best is not None:
        centre = {k: math.log2(v) for k, v in best.items() if k != "MODE"}
        mode = best["MODE"]
    rows = []
    for values in itertools.product(*SPACE.values()):
        cfg = dict(zip(SPACE, values, strict=True))
        smem = cfg["num_stages"] * (cfg["BLOCK_SIZE_M"] + cfg["BLOCK_SIZE_N"]) * cfg["BLOCK_SIZE_K"] * 2
        if smem > 160 * 1024:
            continue  # pruned by the constraints: not in the data
        cost = sum(w * (math.log2(cfg[k]) - centre[k]) ** 2 for k, w in
                   (("BLOCK_SIZE_M", 0.08), ("BLOCK_SIZE_N", 0.05), ("BLOCK_SIZE_K", 0.04),
                    ("num_warps", 0.1), ("num_stages", 0.05)))
        t = 0.1 * math.exp(cost + rugged * rng.standard_normal()) * (1.0 if cfg["MODE"] == mode else 1.03)
        status = "ok"
        if smem > 96 * 1024 and cfg["num_warps"] == 4:
            status = "compile_error"
        elif rng.random() < 0.02:
            status = "inaccurate"
        rows.append({"config": cfg, "status": status, "time_ms": t if status == "ok" else None,
                     "spread": 0.01 if status == "ok" else None})
    for r in rows:
        if r["config"] == best:
            r.update(status="ok", time_ms=0.95 * 0.1, spread=0.01)
    return rows


def write_dataset(path, points=((1, 8), (16, 8)), seed: int = 0, best: dict | None = None,
                  rugged: float = 0.02) -> pd.DataFrame:
    """A replay CSV with one point per (tokens, top_k) of a toy op on E=8 experts."""
    rows = []
    for i, (tokens, top_k) in enumerate(points):
        routes = tokens * top_k
        shape = {"E": 8, "N": 512, "K": 256, "top_k": top_k}
        for r in landscape(seed * 100 + i, routes / 8, best, rugged):
            rows.append({"kernel": "toy.gemm", "device_name": "Synthetic GPU", "arch": "sm_90",
                         "shape": json.dumps(shape, sort_keys=True, separators=(",", ":")), "tokens": tokens,
                         "routes": routes, "active_fraction": 1.0, "routing": "uniform",
                         "density": routes / 8,
                         "config": json.dumps(r["config"], sort_keys=True, separators=(",", ":")),
                         "status": r["status"], "time_ms": r["time_ms"], "spread": r["spread"]})
    df = pd.DataFrame(rows)
    df.to_csv(path, index=False)
    return df
