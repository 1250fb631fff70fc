"""A replay noise model calibrated on repeated sweeps of the same point.

Two sweeps that measured the same config at the same point (kernel, device, shape,
density, routing) disagree by more than either reading's own spread says: clocks,
the other processes, a cut-short timing. :func:`fit_repeat_noise` pairs every such
config across two sweep ids, removes the pair of sweeps' common shift at the point
(a shift moves every config alike, so it changes no choice), and fits the log-ratio
per range of time relative to the point's best: a normal core (robust: 1.4826 x the
median absolute deviation), each reading carrying half the variance of the ratio
(so divided by sqrt(2)), plus a tail of the ratios beyond ``TAIL_MADS`` of it. A
tail pair is one disturbed reading: interference only slows a run (the export's
rule too), so a tail draw slows the reading by the whole ratio, and half the tail
pairs' share of readings is disturbed. :class:`RepeatNoise` draws from that mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

POINT = ["kernel", "device_name", "shape", "tokens", "routes", "active_fraction", "routing"]
EDGES = (1.0, 1.05, 1.2, 1.5, math.inf)  # ranges of time / the point's best
MIN_PAIRS = 10  # configs a pair of sweeps must share at a point to estimate their common shift
TAIL_MADS = 4.0  # a log-ratio beyond this many robust sigmas is a tail reading
MIN_BIN = 30  # pairs a range needs; sparser ranges take the next range's fit


@dataclass(frozen=True)
class NoiseBin:
    """The log-noise of one reading in one range of relative time."""

    upto: float  # relative time (over the point's best) this range ends at
    sigma: float  # core sigma of log time
    tail_share: float  # share of readings slowed by a disturbance
    tail_sigma: float  # sigma of a disturbance's log slowdown (a half-normal)
    pairs: int  # repeated pairs the fit saw


@dataclass(frozen=True)
class RepeatNoise:
    bins: tuple[NoiseBin, ...]

    def bin(self, rel: float) -> NoiseBin:
        return next((b for b in self.bins if rel < b.upto), self.bins[-1])

    def draw(self, rng: np.random.Generator, rel: float, scale: float = 1.0) -> float:
        """A multiplicative factor for one reading of a config at ``rel`` x the point's best."""
        b = self.bin(rel)
        slow = abs(b.tail_sigma * rng.standard_normal()) if rng.random() < b.tail_share else 0.0
        return math.exp(scale * (b.sigma * rng.standard_normal() + slow))

    def describe(self) -> str:
        lo, parts = 1.0, []
        for b in self.bins:
            hi = "inf" if math.isinf(b.upto) else f"{b.upto:g}"
            parts.append(f"{lo:g}-{hi}x best: sigma {100 * b.sigma:.2f}%, {100 * b.tail_share:.1f}% slowed "
                         f"by |N(0, {100 * b.tail_sigma:.1f}%)| ({b.pairs} pairs)")
            lo = b.upto
        return "; ".join(parts)


def repeat_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Configs measured ok in two sweeps at one point: their log-ratio less the sweeps' shift at the point
    (``r``), and the faster reading over the point's best (``rel``)."""
    need = {*POINT, "config", "status", "time_ms", "sweep_id"}
    missing = need - set(frame.columns)
    if missing:
        raise ValueError(f"--noise-data: lacks column(s) {sorted(missing)}")
    ok = frame[(frame["status"] == "ok") & frame["time_ms"].notna() & (frame["time_ms"] > 0)]
    per = ok.groupby([*POINT, "config", "sweep_id"], dropna=False)["time_ms"].median().reset_index()
    pairs = per.merge(per, on=[*POINT, "config"], suffixes=("_a", "_b"))
    pairs = pairs[pairs["sweep_id_a"] < pairs["sweep_id_b"]]
    if pairs.empty:
        return pairs.assign(r=[], rel=[])
    lr = np.log(pairs["time_ms_b"] / pairs["time_ms_a"])
    group = [*POINT, "sweep_id_a", "sweep_id_b"]
    pairs = pairs.assign(lr=lr)
    stats = pairs.groupby(group, dropna=False)["lr"].agg(shift="median", n="size").reset_index()
    pairs = pairs.merge(stats, on=group)
    pairs = pairs[pairs["n"] >= MIN_PAIRS]
    best = ok.groupby(POINT, dropna=False)["time_ms"].min().rename("best").reset_index()
    pairs = pairs.merge(best, on=POINT)
    rel = np.minimum(pairs["time_ms_a"], pairs["time_ms_b"]) / pairs["best"]
    return pairs.assign(r=pairs["lr"] - pairs["shift"], rel=rel)


def fit_repeat_noise(frame: pd.DataFrame) -> RepeatNoise:
    """The noise of one reading per range of relative time, from the repeated pairs in ``frame``."""
    pairs = repeat_pairs(frame)
    if len(pairs) < MIN_BIN:
        raise ValueError(f"--noise-data: {len(pairs)} repeated measurements; at least {MIN_BIN} are needed "
                         f"(configs measured at one point by two sweeps, {MIN_PAIRS}+ shared per pair)")
    fits: list[NoiseBin | None] = []
    lo = EDGES[0]
    for hi in EDGES[1:]:
        r = pairs["r"][(pairs["rel"] >= lo) & (pairs["rel"] < hi)].to_numpy()
        lo = hi
        if len(r) < MIN_BIN:
            fits.append(None)
            continue
        mad = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        tail = r[np.abs(r) > TAIL_MADS * mad] if mad > 0 else r[:0]
        tail_sigma = float(np.sqrt((tail ** 2).mean())) if len(tail) else 0.0
        fits.append(NoiseBin(hi, mad / math.sqrt(2), len(tail) / len(r) / 2, tail_sigma, len(r)))
    known = [f for f in fits if f is not None]
    if not known:  # every range sparse: one fit over all of them
        r = pairs["r"].to_numpy()
        mad = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        return RepeatNoise((NoiseBin(math.inf, mad / math.sqrt(2), 0.0, 0.0, len(r)),))
    out, nxt = [], known[-1]
    for f, hi in zip(reversed(fits), reversed(EDGES[1:]), strict=True):
        nxt = f if f is not None else NoiseBin(hi, nxt.sigma, nxt.tail_share, nxt.tail_sigma, 0)
        out.append(nxt)
    return RepeatNoise(tuple(reversed(out)))
