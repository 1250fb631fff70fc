"""Tile rules: what a kernel op's configs may be, and which one to use where no table covers a point.

The serving half of a kernel's description. The picker reads only these (shapes, config checks,
constraints, the heuristic); the tuner's :class:`moetune.specs.base.KernelSpec` extends them with
how to make inputs, run, check and time the op. Built-in rules live in each kernel path's
``config.py``; third-party kernels arrive through the ``moetune.kernels`` entry-point group (a
spec is a rule set too) or :func:`register_rules`. A plugin that fails to load is skipped with
one warning naming it; :data:`PLUGIN_ERRORS` keeps why, for the CLI to say.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.device import DeviceInfo
from moetune.problem import Config, Problem

ENTRY_POINT_GROUP = "moetune.kernels"
# Kernel family (the op name before its first dot) -> the module whose RULES hold its ops' rules.
BUILTIN_RULES = {
    "fp8_decode": "moetune.kernels.fp8_decode.config",
    "fp4_prefill": "moetune.kernels.fp4_prefill.config",
    "gather_rows": "moetune.kernels.gather_rows.config",
}


class TileRules:
    """The configs of one kernel op. Subclasses set the class attributes and override methods.

    Class attributes:
        name: op name as tables and the CLI use it, e.g. ``"fp8_decode.gate_up"``.
        space: tunable parameter -> candidate values (the full grid before constraints).
        default: the shipped default config.
        shape_defaults: optional shape fields and their defaults (e.g. a dtype).
    """

    name: str = ""
    description: str = ""
    space: Mapping[str, Sequence[Any]] = {}
    default: Config = {}
    shape_defaults: Mapping[str, Any] = {}

    def normalize_shape(self, shape: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check the shape; ValueError naming the field on bad input."""
        out = dict(self.shape_defaults)
        out.update(shape)
        for key in ("E", "N", "K", "top_k"):
            if key not in out:
                raise ValueError(f"{self.name}: shape needs {key!r}")
            if not isinstance(out[key], int) or out[key] < 1:
                raise ValueError(f"{self.name}: shape field {key} must be a positive int, got {out[key]!r}")
        unknown = set(out) - {"E", "N", "K", "top_k"} - set(self.shape_defaults)
        if unknown:
            raise ValueError(f"{self.name}: unknown shape field(s) {sorted(unknown)}")
        return out

    def check_config(self, config: Mapping[str, Any]) -> None:
        """ValueError naming the key for a config the kernel does not know or cannot run.

        Problem-independent checks only (unknown keys, value types, alignment).
        """
        unknown = set(config) - set(self.space) - set(self.default)
        if unknown:
            raise ValueError(f"{self.name}: unknown config key(s) {sorted(unknown)}; "
                             f"known: {sorted(set(self.space) | set(self.default))}")

    def constraint(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        """Why ``config`` must not be tried on ``problem`` (None when it may).

        Covers what the kernel cannot run or would silently clamp: misaligned
        BLOCK_SIZE_K, shared memory over the device's limit, tiles far larger than the problem.
        """
        try:
            key = tuple(config.items())
            checked = self.__dict__.setdefault("_checked", {})
            if key not in checked:  # a sweep checks the same ~10^4 configs at every density
                checked[key] = self._check_reason(config)
            return checked[key]
        except TypeError:  # unhashable values: check without the cache
            return self._check_reason(config)

    def _check_reason(self, config: Config) -> str | None:
        try:
            self.check_config(config)
        except ValueError as e:
            return str(e)
        return None

    def heuristic(self, shape: Mapping[str, Any], routes: int, arch: str) -> Config:
        """The config to use where no table covers a point (the picker's fallback)."""
        return dict(self.default)



_RULES: dict[str, TileRules] = {}
_PLUGINS: list[TileRules] | None = None
PLUGIN_ERRORS: dict[str, str] = {}  # entry-point name -> why it did not load


def register_rules(rules: TileRules) -> TileRules:
    if not rules.name:
        raise ValueError(f"{type(rules).__name__} has no name")
    _RULES[rules.name] = rules
    return rules


def plugins() -> list[TileRules]:
    """The rule sets (usually specs) of the ``moetune.kernels`` entry points, loaded once. An entry
    point may name a rule set, a class or factory that makes one, or a list of them."""
    global _PLUGINS
    if _PLUGINS is not None:
        return _PLUGINS
    _PLUGINS = []
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, TileRules):
                obj = obj()
            loaded = list(obj) if isinstance(obj, (list, tuple)) else [obj]
            for rules in loaded:
                if not isinstance(rules, TileRules) or not rules.name:
                    raise TypeError(f"{rules!r} is not a named moetune TileRules or KernelSpec")
        except Exception as e:  # a broken plugin must not take the built-in kernels down
            PLUGIN_ERRORS[ep.name] = f"{type(e).__name__}: {e}"
            warnings.warn(f"moetune: skipping kernel plugin {ep.name!r} ({ep.value}): "
                          f"{PLUGIN_ERRORS[ep.name]}", RuntimeWarning, stacklevel=2)
            continue
        for rules in loaded:
            register_rules(rules)
            _PLUGINS.append(rules)
    return _PLUGINS


def get_rules(name: str) -> TileRules:
    """The rules of op ``name``: a built-in one, a registered one, or a plugin's."""
    if name not in _RULES:
        module = BUILTIN_RULES.get(name.split(".", 1)[0])
        if module is not None:
            for rules in importlib.import_module(module).RULES:
                _RULES.setdefault(rules.name, rules)
    if name not in _RULES:
        plugins()
    if name not in _RULES:
        raise ValueError(unknown_kernel(name))
    return _RULES[name]


def known_names() -> list[str]:
    """Every op name with rules: the built-ins, registered ones and the plugins'."""
    for module in BUILTIN_RULES.values():
        for rules in importlib.import_module(module).RULES:
            _RULES.setdefault(rules.name, rules)
    plugins()
    return sorted(_RULES)


def unknown_kernel(name: str) -> str:
    """The one line that says ``name`` is no kernel: the known ones, and plugins that failed to load."""
    text = f"unknown kernel {name!r}; known kernels: {', '.join(known_names())}"
    if PLUGIN_ERRORS:
        failed = "; ".join(f"{k} ({v})" for k, v in PLUGIN_ERRORS.items())
        text += f"; kernel plugins that failed to load: {failed}"
    return text


def picked_routes(tokens: int, top_k: int, active_share: float | None = None) -> int:
    """The route count the layer asks the tile picker for: every route, or the ones ``active_share``
    (the deployment's static expectation of the active share of the top-k slots) says are active.
    The tables are keyed on active routes; launches still cover every route. A share of 0 leaves only
    the launches to pay, where every route's tiles have the coarser grid: it asks for every route
    (docs/kernels/fp8_decode.md, layer options)."""
    if active_share is None:
        return tokens * top_k
    if isinstance(active_share, bool) or not isinstance(active_share, (int, float)) \
            or not 0 <= active_share <= 1:
        raise ValueError(f"active_share must be None or a number in [0, 1], got {active_share!r}")
    return round(tokens * top_k * active_share) or tokens * top_k
