"""Which points a sweep tunes: kernel ops x shapes x route densities x routing distributions.

Shapes come from a model preset (per rank under ``--tp``/``--ep``) or an explicit
``--shape``; densities from a ``--tokens`` list (with active fractions, for decode)
or a ``--routes`` list (prefill). Every bad value is a ValueError that names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune.device import DeviceInfo
from moetune.models import get_model
from moetune.problem import Problem
from moetune.routing import load_trace, parse_routing
from moetune.specs.base import KernelSpec
from moetune.specs.registry import all_specs, get_spec

# Densities at most 1.5x apart: the picker serves a density between two table entries with the nearer
# one's config, and between power-of-two entries the best config moves enough that the pick reads
# well off a direct sweep's best (see docs/tuner.md, "Density grid").
DECODE_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DECODE_ACTIVE = (1.0, 0.5, 0.25)
PREFILL_ROUTES = (768, 1152, 1536, 2304, 3072, 4608, 6144, 9216, 12288, 18432, 24576, 36864, 49152, 73728,
                  98304)
# The Triton interpreter runs a tiny problem in seconds and a real one in hours.
INTERPRETER_MODEL = "tiny"
INTERPRETER_TOKENS = (1, 4)
INTERPRETER_ROUTES = (8, 32)
INTERPRETER_MAX_ROUTES = 256


@dataclass
class Plan:
    """The problems to tune, in order, plus notes the CLI prints (clamps, defaults chosen)."""

    problems: list[Problem]
    notes: list[str] = field(default_factory=list)


def is_decode(spec: KernelSpec) -> bool:
    """Decode ops are tuned over token counts (and active fractions); the rest over routes."""
    return "decode" in spec.name


def resolve_kernels(names: Sequence[str], weight_format: str | None = None) -> list[KernelSpec]:
    """Op names or families (``fp8_decode`` = every ``fp8_decode.*`` op), in the order given.

    With no names: the ops serving ``weight_format`` (plus format-agnostic ones), or all ops.
    """
    specs = all_specs()
    if not names:
        if weight_format is None:
            chosen = specs
        else:
            chosen = [s for s in specs if s.weight_format == weight_format]
            if chosen:  # format-agnostic ops (the gather) come along with a model's own kernels
                chosen += [s for s in specs if s.weight_format is None]
        if not chosen:
            raise ValueError(f"no kernel serves {weight_format} weights; choose one with --kernel "
                             f"({', '.join(s.name for s in specs)})")
        return chosen
    out: list[KernelSpec] = []
    for name in names:
        family = [s for s in specs if s.name.startswith(name + ".")]
        found = family or [get_spec(name)]  # get_spec raises the 'unknown kernel' error
        out += [s for s in found if s not in out]
    return out


def parse_shape(text: str) -> dict[str, Any]:
    """"E=8,N=256,K=512,top_k=2,dtype=bfloat16" -> dict (ints where the value is an int)."""
    shape: dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"--shape {text!r}: expected KEY=VALUE pairs separated by commas")
        try:
            shape[key] = int(value)
        except ValueError:
            shape[key] = value
    if not shape:
        raise ValueError("--shape is empty; expected e.g. E=8,N=256,K=512,top_k=2")
    return shape


def _densities(spec: KernelSpec, top_k: int, tokens: Sequence[int], routes: Sequence[int],
               active: Sequence[float], interpreter: bool) -> list[tuple[int, float]]:
    """(tokens, active fraction) pairs for one op."""
    for f in active:
        if not 0 < f <= 1:
            raise ValueError(f"--active fractions must be in (0, 1], got {f}")
    for t in list(tokens) + list(routes):
        if t < 1:
            raise ValueError(f"--tokens/--routes values must be >= 1, got {t}")
    if routes:
        out = []
        for r in routes:
            if r % top_k:
                raise ValueError(f"--routes {r} is not a multiple of {spec.name}'s top_k {top_k}")
            out.append((r // top_k, 1.0))
        return out
    decode = is_decode(spec)
    if not tokens:
        if interpreter:
            tokens = INTERPRETER_TOKENS if decode else [max(1, r // top_k) for r in INTERPRETER_ROUTES]
        else:
            tokens = DECODE_TOKENS if decode else [r // top_k for r in PREFILL_ROUTES if r % top_k == 0]
    if not active:
        active = DECODE_ACTIVE if decode else (1.0,)
    return [(t, f) for t in tokens for f in active if round(t * top_k * f) >= 1]


def build_plan(kernels: Sequence[str] = (), *, model: str | None = None, tp: int = 1, ep: int = 1,
               shape: str | dict | None = None, tokens: Sequence[int] = (), routes: Sequence[int] = (),
               active: Sequence[float] = (), routing: Sequence[str] = ("uniform",),
               device: DeviceInfo) -> Plan:
    """Every problem a sweep covers, validated up front so bad input fails before anything runs."""
    if model is None and shape is None:
        raise ValueError("give --model or --shape")
    if model is not None and shape is not None:
        raise ValueError("give --model or --shape, not both")
    if tokens and routes:
        raise ValueError("give --tokens or --routes, not both")
    if routes and active:
        raise ValueError("--active applies to --tokens; --routes already counts active routes")
    interpreter = device.arch == "interpreter"
    notes: list[str] = []
    preset = get_model(model) if model is not None else None
    specs = resolve_kernels(kernels, preset.weight_format if preset else None)
    if preset is not None:
        preset.per_rank(tp, ep)  # validates --tp/--ep against the real model even when clamped
        if interpreter and preset.name != INTERPRETER_MODEL:
            notes.append(f"interpreter mode (no GPU): tuning the '{INTERPRETER_MODEL}' model's shapes "
                         f"instead of {preset.name}'s")
            preset, tp, ep = get_model(INTERPRETER_MODEL), 1, 1
    elif tp != 1 or ep != 1:
        raise ValueError("--tp/--ep need --model (an explicit --shape is already per rank)")
    explicit = parse_shape(shape) if isinstance(shape, str) else shape
    routings = list(routing) or ["uniform"]
    for r in routings:
        parse_routing(r)
    if interpreter and (any(r > INTERPRETER_MAX_ROUTES for r in routes)):
        notes.append(f"interpreter mode (no GPU): dropping --routes over {INTERPRETER_MAX_ROUTES}")
        routes = [r for r in routes if r <= INTERPRETER_MAX_ROUTES]
        if not routes:
            raise ValueError(f"every --routes value is over the interpreter's {INTERPRETER_MAX_ROUTES}")

    problems: list[Problem] = []
    for spec in specs:
        raw = spec.shape_from_model(preset, tp, ep) if preset is not None else explicit
        op_shape = spec.normalize_shape(raw)
        top_k = op_shape["top_k"]
        if top_k > op_shape["E"]:
            raise ValueError(f"{spec.name}: top_k {top_k} exceeds the {op_shape['E']} experts")
        pairs = _densities(spec, top_k, tokens, routes, active, interpreter)
        if interpreter and any(t * top_k > INTERPRETER_MAX_ROUTES for t, _ in pairs):
            notes.append(f"interpreter mode (no GPU): {spec.name}: dropping densities over "
                         f"{INTERPRETER_MAX_ROUTES} routes")
            pairs = [(t, f) for t, f in pairs if t * top_k <= INTERPRETER_MAX_ROUTES]
        for r in routings:
            kind, arg = parse_routing(r)
            if kind == "trace":
                load_trace(arg, op_shape["E"], top_k)  # wrong shape or ids -> ValueError now
            problems += [spec.problem(op_shape, t, f, r) for t, f in pairs]
    if not problems:
        raise ValueError("no problems to tune: the density grid is empty")
    return Plan(problems, notes)
