"""A point a kernel op runs at (shape and route density), and the canonical text of configs and shapes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]


def canonical_json(obj: Any) -> str:
    """Stable text for a config or shape: sorted keys, no spaces. Used as a key everywhere."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Problem:
    """One point a kernel op is tuned at: a shape and a route density.

    ``shape`` holds the op's shape fields (always ``E``, ``N``, ``K``, ``top_k``,
    plus op-specific ones such as a dtype). ``routes`` is the number of routed
    rows the op processes: ``tokens * top_k * active_fraction``.
    """

    kernel: str
    shape: Mapping[str, Any]
    tokens: int
    routes: int
    active_fraction: float = 1.0
    routing: str = "uniform"  # "uniform", "zipf:<s>" or "trace:<path>"

    @property
    def density(self) -> float:
        """Rows per expert, the key tables are indexed by."""
        return self.routes / self.shape["E"]

    @property
    def shape_key(self) -> str:
        return canonical_json(dict(self.shape))

    def describe(self) -> str:
        s = " ".join(f"{k}={v}" for k, v in sorted(self.shape.items()))
        frac = "" if self.active_fraction == 1 else f" active={self.active_fraction:g}"
        return f"{self.kernel} [{s}] tokens={self.tokens} routes={self.routes}{frac} {self.routing}"
