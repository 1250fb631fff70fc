"""Exhaustive search: every constrained candidate, in space order (the reference for other strategies)."""

from __future__ import annotations

from ..spec import Config
from .base import Strategy


class Exhaustive(Strategy):
    name = "exhaustive"

    def propose(self, n: int) -> list[Config]:
        assert self.ctx is not None, "start() first"
        return self.fresh(self.ctx.candidates, n)
