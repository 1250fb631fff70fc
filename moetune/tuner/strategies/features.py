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

from moetune.problem import Config, canonical_json


def _numeric(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class Space:
    """Ordered values per parameter, a key index, features and one-step neighbours of candidates."""

    def __init__(self, candidates: Sequence[Config], keys: Sequence[str] | None = None):
        """``keys``: the candidates' canonical JSON, if the caller has it (a sweep's plan does)."""
        if not candidates:
            raise ValueError("candidates must not be empty")
        if keys is not None and len(keys) != len(candidates):
            raise ValueError(f"{len(keys)} keys for {len(candidates)} candidates")
        self.candidates = list(candidates)
        self.keys = list(keys) if keys is not None else [canonical_json(c) for c in self.candidates]
        self.index = {k: i for i, k in enumerate(self.keys)}
        names = dict.fromkeys(p for c in self.candidates[:1] for p in c)
        if any(c.keys() != names.keys() for c in self.candidates):  # mixed key sets: all of them
            names = dict.fromkeys(p for c in self.candidates for p in c)
        columns = {p: [c.get(p) for c in self.candidates] for p in names}
        params = {p: dict.fromkeys(col) for p, col in columns.items()}  # values in order of first use
        # only parameters that vary matter; numeric ones ordered by value, categorical by first use
        self.values = {p: (sorted(vs) if all(_numeric(v) for v in vs) else list(vs))
                       for p, vs in params.items() if len(vs) > 1}
        self.numeric = {p for p, vs in self.values.items() if all(_numeric(v) for v in vs)}
        self.features = self._encode(columns)
        # each candidate as its value positions, packed in one int: neighbours are found by arithmetic
        # and a dict lookup, not by a JSON key per step (a prior smooths ~10^5 candidates' neighbours)
        self._order = sorted(self.values, key=lambda p: p not in self.numeric)
        self._stride = {}
        stride = 1
        for p in self._order:
            self._stride[p] = stride
            stride *= len(self.values[p])
        position = {p: {v: j for j, v in enumerate(self.values[p])} for p in self._order}
        self._at = {p: [position[p][v] for v in columns[p]] for p in self._order}
        codes = [0] * len(self.candidates)
        for p in self._order:
            st = self._stride[p]
            codes = [c + a * st for c, a in zip(codes, self._at[p], strict=True)]
        self._codes = codes
        self._by_code = {c: i for i, c in enumerate(codes)}

    def _encode(self, columns: dict[str, list]) -> np.ndarray:
        """log2 of numeric values scaled to [0, 1]; one-hot categoricals scaled so a mismatch counts 1."""
        cols = []
        for p, vs in self.values.items():
            column = columns[p]
            if p in self.numeric:
                pos = all(v > 0 for v in vs)
                x = np.array(column, dtype=float)
                x = np.log2(x) if pos else x
                lo, hi = (math.log2(vs[0]), math.log2(vs[-1])) if pos else (vs[0], vs[-1])
                cols.append((x - lo) / (hi - lo))
            else:
                code = {v: i for i, v in enumerate(vs)}
                at = np.array([code.get(v, -1) for v in column])
                onehot = (at[:, None] == np.arange(len(vs))[None, :]).astype(float) / math.sqrt(2)
                cols.extend(onehot.T)
        return np.stack(cols, axis=1) if cols else np.zeros((len(self.candidates), 1))

    def neighbours(self, i: int) -> list[int]:
        """Candidates one step away from candidate ``i`` along one parameter (skipping values the
        constraints pruned at this point), numeric steps first."""
        code = self._codes[i]
        out: list[int] = []
        for p in self._order:
            at, st, n = self._at[p][i], self._stride[p], len(self.values[p])
            if p in self.numeric:
                for step in (-1, 1):
                    j = at + step
                    while 0 <= j < n:
                        k = self._by_code.get(code + (j - at) * st)
                        if k is not None:
                            out.append(k)
                            break
                        j += step
            else:
                for j in range(n):
                    k = self._by_code.get(code + (j - at) * st) if j != at else None
                    if k is not None:
                        out.append(k)
        return out
