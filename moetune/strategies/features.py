"""The geometry of a candidate list, shared by the adaptive strategies.

Everything is derived from the constrained candidates themselves (not the spec's
grid), so pruned values never appear and a replay needs no spec. Numeric
parameters are ordered lists (tile sizes are powers of two: log2 makes their
steps even); anything else (strings, bools) is categorical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..spec import Config, canonical_json


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class Space:
    """Ordered values per parameter, a key index, features and one-step neighbours of candidates."""

    def __init__(self, candidates: Sequence[Config]):
        if not candidates:
            raise ValueError("candidates must not be empty")
        self.candidates = list(candidates)
        self.keys = [canonical_json(c) for c in self.candidates]
        self.index = {k: i for i, k in enumerate(self.keys)}
        params: dict[str, list] = {}
        for c in self.candidates:
            for p, v in c.items():
                seen = params.setdefault(p, [])
                if v not in seen:
                    seen.append(v)
        # only parameters that vary matter; numeric ones ordered by value, categorical by first use
        self.values = {p: (sorted(vs) if all(_numeric(v) for v in vs) else vs)
                       for p, vs in params.items() if len(vs) > 1}
        self.numeric = {p for p, vs in self.values.items() if all(_numeric(v) for v in vs)}
        self.features = self._encode(self.candidates)

    def _encode(self, configs: Sequence[Config]) -> np.ndarray:
        """log2 of numeric values scaled to [0, 1]; one-hot categoricals scaled so a mismatch counts 1."""
        cols = []
        for p, vs in self.values.items():
            if p in self.numeric:
                pos = all(v > 0 for v in vs)
                x = np.array([math.log2(c[p]) if pos else float(c[p]) for c in configs])
                lo, hi = (math.log2(vs[0]), math.log2(vs[-1])) if pos else (vs[0], vs[-1])
                cols.append((x - lo) / (hi - lo))
            else:
                for v in vs:
                    cols.append(np.array([float(c.get(p) == v) for c in configs]) / math.sqrt(2))
        return np.stack(cols, axis=1) if cols else np.zeros((len(configs), 1))

    def neighbours(self, i: int) -> list[int]:
        """Candidates one step away from candidate ``i`` along one parameter (skipping values the
        constraints pruned at this point), numeric steps first."""
        base = self.candidates[i]
        out: list[int] = []
        for p in sorted(self.values, key=lambda p: p not in self.numeric):
            vs = self.values[p]
            if base.get(p) not in vs:
                continue
            at = vs.index(base[p])
            if p in self.numeric:
                for step in (-1, 1):
                    j = at + step
                    while 0 <= j < len(vs):
                        k = self.index.get(canonical_json({**base, p: vs[j]}))
                        if k is not None:
                            out.append(k)
                            break
                        j += step
            else:
                for v in vs:
                    k = self.index.get(canonical_json({**base, p: v})) if v != base[p] else None
                    if k is not None:
                        out.append(k)
        return out
