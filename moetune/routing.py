"""Routing distributions for tuning problems: which experts each token's top-k slots pick."""

from __future__ import annotations

import functools
from pathlib import Path

import torch


def parse_routing(routing: str) -> tuple[str, str | None]:
    """"uniform" | "zipf:<s>" | "trace:<path>" -> (kind, argument); ValueError otherwise."""
    kind, _, arg = routing.partition(":")
    if kind == "uniform" and not arg:
        return kind, None
    if kind == "zipf":
        try:
            s = float(arg)
        except ValueError:
            s = -1.0
        if s <= 0:
            raise ValueError(f"routing {routing!r}: zipf needs a positive exponent, e.g. zipf:1.2")
        return kind, arg
    if kind == "trace" and arg:
        return kind, arg
    raise ValueError(f"unknown routing {routing!r}; use uniform, zipf:<s> or trace:<file.npy|file.pt>")


def load_trace(path: str | Path, num_experts: int, top_k: int) -> torch.Tensor:
    """A recorded [tokens, top_k] tensor of expert ids, checked against the shape."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist")
    if path.suffix not in (".npy", ".pt"):
        raise ValueError(f"trace file {path} must be .npy or .pt")
    try:
        if path.suffix == ".npy":
            import numpy as np

            ids = torch.from_numpy(np.load(path, allow_pickle=False))
        else:
            ids = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unreadable file (numpy's refusals are ValueErrors too): say which
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot read trace file {path}: {first}") from e
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] != top_k or ids.shape[0] == 0:
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"trace file {path}: expected [tokens, {top_k}] expert ids, got {got}")
    if ids.is_floating_point() or ids.is_complex():
        raise ValueError(f"trace file {path}: expert ids must be integers, got {ids.dtype}")
    ids = ids.long()
    if ids.min() < -1 or ids.max() >= num_experts:
        raise ValueError(f"trace file {path}: ids outside [-1, {num_experts})")
    return ids


TYPICAL_TRIES = 64  # draws a typical uniform routing may take before it keeps the closest
# Draws after the first are made in batches, each one draw of many tokens split into groups: one host
# sync a batch instead of one a draw (a loop of single draws, each a few launches and a sync, made input
# drawing the largest share of a candidate's overhead). This caps a batch's logits, tokens x experts x draws.
TYPICAL_BATCH_ELEMS = 1 << 22


def expected_distinct(tokens: int, active: int, num_experts: int) -> float:
    """Expected number of distinct experts among ``tokens`` uniform draws of ``active`` distinct experts
    each (an expert is missed by one token with probability 1 - active / E)."""
    return num_experts * (1.0 - (1.0 - active / num_experts) ** tokens)


def _distinct(ids: torch.Tensor, num_experts: int) -> list[int]:
    """Distinct active experts of each draw in ``ids`` [draws, tokens, top_k] (one host sync)."""
    seen = torch.zeros(ids.shape[0], num_experts + 1, dtype=torch.bool, device=ids.device)
    seen.scatter_(1, ids.reshape(ids.shape[0], -1).long() + 1, True)  # inactive (-1) lands in column 0
    return seen[:, 1:].sum(dim=1).tolist()


def make_routes(tokens: int, top_k: int, num_experts: int, *, routing: str = "uniform",
                active_fraction: float = 1.0, generator: torch.Generator | None = None,
                device: str | torch.device = "cpu", typical: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids int32 [tokens, top_k], topk_weights fp32 [tokens, top_k]).

    Each token picks ``top_k`` distinct experts. With ``active_fraction < 1`` a
    random subset of each token's slots is marked inactive (id -1), as hybrid
    CPU/GPU decode does. Weights are positive and sum to 1 over active slots.
    The draws happen on ``generator``'s device (a CUDA generator keeps the tuner's per-candidate
    routing off the CPU, which the compile workers keep busy).

    ``typical`` (uniform routing): draw again until the number of distinct active experts is its
    expectation, rounded (at most ``TYPICAL_TRIES`` draws, then the closest), so that every draw reads
    the same expert bytes. The tuner draws each candidate's routing afresh, and at decode densities the
    distinct-expert count alone moves one config's time by a few percent: the fastest of thousands of
    candidates would partly be the luckiest draw (docs/tuner.md, Noise).
    """
    if typical and parse_routing(routing)[0] == "uniform":
        want = round(expected_distinct(tokens, round(top_k * active_fraction), num_experts))
        draw = functools.partial(make_routes, top_k=top_k, num_experts=num_experts, routing=routing,
                                 active_fraction=active_fraction, generator=generator, device=device)
        ids, weights = draw(tokens)
        best, tries = (abs(_distinct(ids[None], num_experts)[0] - want), ids, weights), 1
        while best[0] and tries < TYPICAL_TRIES:
            # each batch as many draws as all before it: few syncs, and little waste where a hit comes early
            n = max(1, min(tries, TYPICAL_TRIES - tries, TYPICAL_BATCH_ELEMS // max(1, tokens * num_experts)))
            many, many_w = draw(n * tokens)
            miss = [abs(d - want) for d in _distinct(many.view(n, tokens, top_k), num_experts)]
            i = min(range(n), key=miss.__getitem__)  # the first of the closest
            if miss[i] < best[0]:
                best = (miss[i], many.view(n, tokens, top_k)[i], many_w.view(n, tokens, top_k)[i])
            tries += n
        return best[1], best[2]
    if top_k > num_experts:
        raise ValueError(f"top_k {top_k} exceeds the number of experts {num_experts}")
    if not 0 <= active_fraction <= 1:
        raise ValueError(f"active fraction must be in [0, 1], got {active_fraction}")
    kind, arg = parse_routing(routing)
    g = generator
    at = g.device if g is not None else torch.device("cpu")
    if kind == "trace":
        trace = load_trace(arg, num_experts, top_k)
        reps = -(-tokens // trace.shape[0])
        ids = trace.repeat(reps, 1)[:tokens].clone().to(at)
    else:
        logits = torch.zeros(tokens, num_experts, device=at)
        if kind == "zipf":
            # Zipf-like popularity over a random expert order; Gumbel top-k samples without replacement.
            rank = torch.randperm(num_experts, generator=g, device=at).float() + 1
            logits = logits - float(arg) * rank.log()
        uniform = torch.rand(tokens, num_experts, generator=g, device=at)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
        ids = (logits + gumbel).topk(top_k, dim=1).indices
    weights = torch.rand(tokens, top_k, generator=g, device=at) + 0.1
    n_active = round(top_k * active_fraction)
    if n_active < top_k:
        order = torch.rand(tokens, top_k, generator=g, device=at).argsort(dim=1)
        inactive = order >= n_active
        ids = ids.masked_fill(inactive, -1)
        weights = weights.masked_fill(inactive, 0.0)
    weights = weights / weights.sum(dim=1, keepdim=True).clamp_min(1e-20)
    return ids.to(torch.int32).to(device), weights.float().to(device)
