"""Search strategies behind one interface (:mod:`.base`); one module per strategy.

:func:`get_strategy` builds one by name. A new strategy subclasses
:class:`~.base.Strategy` and is added to ``STRATEGIES``.
"""

from __future__ import annotations

from moetune.tuner.strategies.base import Observation, SearchContext, Strategy
from moetune.tuner.strategies.coordinate import CoordinateDescent
from moetune.tuner.strategies.exhaustive import Exhaustive
from moetune.tuner.strategies.model import ModelGuided
from moetune.tuner.strategies.prior import PriorGuided
from moetune.tuner.strategies.random import RandomSearch

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (Exhaustive, RandomSearch, CoordinateDescent, ModelGuided, PriorGuided)
}
DEFAULT_STRATEGY = "prior"


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known strategies: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]()


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "Observation", "SearchContext", "Strategy", "get_strategy"]
