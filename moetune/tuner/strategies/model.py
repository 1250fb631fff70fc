"""Surrogate-guided search: a Gaussian-process model of log time picks what to measure next.

Tile landscapes are rugged along some parameters (BLOCK_SIZE_N against num_warps)
and flat along others (num_stages often changes nothing). A GP with one length
scale per feature (log2 tile sizes, one-hot switches; :mod:`.features`), fitted by
marginal likelihood, learns which is which: a flat parameter gets a long scale,
so variants of a measured config are predicted with confidence and the search
spends its budget on combinations it knows nothing about instead. Every measured
candidate teaches it: log times are clipped at their median (what is slow is
equally uninteresting, and the model's variance goes to the fast region) and
failed or inaccurate candidates enter at that cap, so the search steers away.

Phases over the search budget:

1. warm start and exploration: the hints (best configs of neighbouring densities),
   then a seeded random sample (``EXPLORE`` of the budget);
2. the model: expected improvement over the best measured log time; a batch is
   filled greedily, each pick added to the model at its predicted mean (kriging
   believer) so a batch spreads out instead of piling on one spot;
3. the polish (the last ``1 - POLISH`` of the budget): best-first coordinate moves around
   the fastest configs; when those run dry the model proposes again.

Then the final interleaved re-measurement of :mod:`.adaptive`. numpy only.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from moetune.problem import Config
from moetune.tuner.strategies.adaptive import AdaptiveStrategy, hint_indices
from moetune.tuner.strategies.base import SearchContext

EXPLORE = 0.1
POLISH = 0.7  # share of the budget after which it polishes the best (docs/tuner.md, "Strategies")
CAP_QUANTILE = 0.5  # log times above this quantile of the ok ones (and failures) are clipped to it
NOISE = 0.015  # relative measurement noise, as re-measurements show (docs/tuner.md, "Noise")
SCALES = (0.15, 0.3, 0.6, 1.2, 2.5, 6.0)  # length-scale grid per feature (features span [0, 1])
REFIT = 1.25  # refit the length scales when the data grew by this factor
POOL = 1000  # most unmeasured candidates scored per batch
MAX_TRAIN = 200  # most measurements the GP is fitted on: the fastest half, a seeded sample of the rest
RANKED = 64  # candidates of the last acquisition kept as guesses for upcoming()


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * (1.0 + np.vectorize(erf)(z / math.sqrt(2)))


class GP:
    """Zero-mean GP on standardised targets, Matern 5/2 kernel with per-feature length scales."""

    def __init__(self, scales: np.ndarray, noise: float):
        self.scales, self.noise = scales, noise

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = (a[:, None, :] - b[None, :, :]) / self.scales
        r = np.sqrt(5.0 * (d * d).sum(axis=2))
        return (1.0 + r + r * r / 3.0) * np.exp(-r)  # Matern 5/2: rougher than squared-exponential

    def fit(self, x: np.ndarray, y: np.ndarray) -> float:
        """Condition on (x, y); returns the log marginal likelihood."""
        self.x = x
        k = self.kernel(x, x) + (self.noise + 1e-6) * np.eye(len(x))
        self.chol = np.linalg.cholesky(k)
        self.alpha = np.linalg.solve(self.chol.T, np.linalg.solve(self.chol, y))
        return float(-0.5 * y @ self.alpha - np.log(np.diag(self.chol)).sum())

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, _, var = self.posterior(xs)
        return mean, np.sqrt(var)

    def posterior(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean, ``v = L^-1 k(x, xs)`` (posterior covariance of xs: k(xs, xs) - v.T v) and variance."""
        ks = self.kernel(xs, self.x)
        v = np.linalg.solve(self.chol, ks.T)
        return ks @ self.alpha, v, np.maximum(1.0 - (v * v).sum(axis=0), 1e-12)

    def believer_picks(self, xs: np.ndarray, best: float, k: int,
                       shift: np.ndarray | None = None) -> tuple[list[int], np.ndarray]:
        """``k`` rows of ``xs`` by expected improvement over ``best``, one at a time, each added to the
        data at its predicted mean (kriging believer) before the next, and the first round's EI.
        Such a fantasy leaves the mean where it was and shrinks the variance by a rank-one term, so
        a batch costs one posterior instead of a refit per pick. ``shift``: a prior mean per row that
        the GP models the residual of."""
        mean, v, var = self.posterior(xs)
        if shift is not None:
            mean = mean + shift
        fantasies = np.zeros((0, len(xs)))  # each pick's update of the covariance with every row
        picks: list[int] = []
        first = None
        for _ in range(min(k, len(xs))):
            sd = np.sqrt(var)
            z = (best - mean) / sd
            ei = (best - mean) * _norm_cdf(z) + sd * _norm_pdf(z)
            ei[picks] = -np.inf
            if first is None:
                first = ei
            j = int(np.argmax(ei))
            picks.append(j)
            cov = self.kernel(xs, xs[j:j + 1])[:, 0] - v.T @ v[:, j] - fantasies.T @ fantasies[:, j]
            u = cov / math.sqrt(max(cov[j], 0.0) + self.noise + 1e-6)
            fantasies = np.vstack([fantasies, u])
            var = np.maximum(var - u * u, 1e-12)
        return picks, first


def fit_scales(x: np.ndarray, y: np.ndarray, noise: float, start: np.ndarray) -> np.ndarray:
    """Per-feature length scales by coordinate ascent of the marginal likelihood over ``SCALES``."""
    scales = start.copy()
    best = GP(scales, noise).fit(x, y)
    for _ in range(2):
        for d in range(len(scales)):
            keep = scales[d]
            for s in SCALES:
                if s == keep:
                    continue
                scales[d] = s
                try:
                    ll = GP(scales, noise).fit(x, y)
                except np.linalg.LinAlgError:
                    continue
                if ll > best:
                    best, keep = ll, s
            scales[d] = keep
    return scales


class ModelGuided(AdaptiveStrategy):
    name = "model"
    polish = POLISH

    def start(self, ctx: SearchContext) -> None:
        super().start(ctx)
        self._rng = np.random.default_rng(zlib.crc32(f"{ctx.seed}:model:{ctx.problem.describe()}".encode()))
        self._order = self._rng.permutation(len(self.space.candidates)).tolist()
        self._hints = hint_indices(self)
        self._scales = np.full(self.space.features.shape[1], 0.6)
        self._fitted_at = 0
        self._ranked: list[int] = []  # the last acquisition's best candidates, best first
        self.prior_mean: np.ndarray | None = None  # per candidate: a prior log time the GP corrects

    # ---- the model -----------------------------------------------------------------------------------
    def _data(self) -> tuple[list[int], np.ndarray]:
        """Measured candidates and their log times; failures count as slower than the slowest ok."""
        times = self.times()
        inside = [o.key for o in self.history if o.key in self.space.index]
        measured = list(dict.fromkeys(self.space.index[k] for k in inside))
        if not times:
            return measured, np.zeros(len(measured))
        logs = np.log(np.array(list(times.values())))
        cap = float(np.quantile(logs, CAP_QUANTILE))  # all that is slow is equally uninteresting
        y = np.array([min(math.log(times[i]), cap) if i in times else cap for i in measured])
        return measured, y

    def _model_picks(self, k: int) -> list[int]:
        idx, y = self._data()
        open_ = np.array([key not in self._seen for key in self.space.keys])
        if len(idx) < 2 or np.ptp(y) == 0:
            return [i for i in self._order if open_[i]][:k]
        if len(idx) > MAX_TRAIN:  # cost grows with the cube of this; the slow region needs few points
            order = np.argsort(y, kind="stable")
            rest = self._rng.choice(order[MAX_TRAIN // 2:], MAX_TRAIN - MAX_TRAIN // 2, replace=False)
            keep = np.concatenate([order[:MAX_TRAIN // 2], rest])
            idx, y = [idx[i] for i in keep], y[keep]
        x = self.space.features[idx]
        prior = self.prior_mean[idx] if self.prior_mean is not None else np.zeros(len(idx))
        resid = y - prior
        mu, sd = resid.mean(), resid.std()
        if self.prior_mean is not None and sd < NOISE:  # the prior explains every reading
            sd = max(y.std(), NOISE)
        ys = (resid - mu) / sd
        noise = (NOISE / sd) ** 2
        if len(idx) >= REFIT * self._fitted_at:
            self._scales = fit_scales(x, ys, noise, self._scales)
            self._fitted_at = len(idx)
        near = self.model_pool()
        pool = np.flatnonzero(open_ if near is None or not (open_ & near).any() else open_ & near)
        if len(pool) > POOL:  # the acquisition on a seeded sample keeps huge spaces cheap
            pool = np.sort(self._rng.choice(pool, POOL, replace=False))
        gp = GP(self._scales, noise)
        gp.fit(x, ys)
        if self.prior_mean is None:
            picks, ei = gp.believer_picks(self.space.features[pool], ys.min(), k)
        else:  # in units of sd, the prior plus the GP's residual: a prediction of y / sd
            shift = (np.minimum(self.prior_mean[pool], y.max() - mu) + mu) / sd
            picks, ei = gp.believer_picks(self.space.features[pool], y.min() / sd, k, shift)
        # the runners-up of this batch: what the next batches likely hold
        self._ranked = pool[np.argsort(-ei, kind="stable")[:RANKED]].tolist()
        return [int(pool[j]) for j in picks]

    def model_pool(self) -> np.ndarray | None:
        """A mask of the candidates the model picks among while any of them is unmeasured; None: all."""
        return None

    # ---- proposals -----------------------------------------------------------------------------------
    def propose(self, n: int) -> list[Config]:
        if self.budget_left() <= 0:
            return []
        total, used = self.search_budget(), len(self._seen)
        # Batches of at most a quarter of the budget, so the model learns between them; smaller ones
        # replayed worse, in more (compile-bound) rounds (docs/tuner.md, "Strategies").
        k = min(n, max(1, total // 4))
        hints = self.unmeasured(self._hints)
        if hints:
            return self.take(hints, k)
        first = self.first_picks(used, total)
        if first:
            return self.take(first, k)
        if used >= self.polish * total:
            moves = self.local_moves(k)
            if moves:
                return self.take(moves, k)
        return self.take(self._model_picks(k), k)

    def first_picks(self, used: int, total: int) -> list[int]:
        """What to measure after the warm starts, before the model: a seeded random ``EXPLORE`` of the
        budget."""
        return self.unmeasured(self._order)[:max(0, math.ceil(EXPLORE * total) - used)]

    def upcoming(self, n: int) -> list[Config]:
        if self.budget_left() <= 0:
            return []
        total, used = self.search_budget(), len(self._seen)
        guess = self.unmeasured(self._hints)
        if used < EXPLORE * total:
            guess += self.unmeasured(self._order[:math.ceil(EXPLORE * total) + n])
        if used >= self.polish * total - n:
            guess += self.local_moves(n)  # as many neighbourhoods as the polish would take
        guess += self.unmeasured(self._ranked)
        return [self.space.candidates[i] for i in dict.fromkeys(guess)][:n]
