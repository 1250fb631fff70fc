"""The replay noise model fitted on repeated sweeps of the same point."""

import json

import numpy as np
import pandas as pd
import pytest

from moetune.tuner.replay_noise import fit_repeat_noise, repeat_pairs

POINT = {"kernel": "toy.gemm", "device_name": "Synthetic GPU", "shape": json.dumps({"E": 8}), "tokens": 1,
         "routes": 8, "active_fraction": 1.0, "routing": "uniform", "status": "ok"}


def _two_sweeps(n=4000, sigma=0.01, slow_share=0.05, slow=0.3, shift=0.03, seed=0) -> pd.DataFrame:
    """One point measured by two sweeps: per-reading log-noise ``sigma``, a share of readings slowed by
    ``slow``, and the second sweep ``shift`` slower throughout."""
    rng = np.random.default_rng(seed)
    truth = np.exp(rng.uniform(0, 2, n)) * 0.01
    rows = []
    for sweep, offset in ((1, 0.0), (2, shift)):
        noise = sigma * rng.standard_normal(n) + slow * (rng.random(n) < slow_share) + offset
        rows += [{**POINT, "config": json.dumps({"i": i}), "sweep_id": sweep, "time_ms": t}
                 for i, t in enumerate(truth * np.exp(noise))]
    return pd.DataFrame(rows)


def test_fit_recovers_the_noise_of_one_reading_and_ignores_a_common_shift():
    model = fit_repeat_noise(_two_sweeps())
    pairs = repeat_pairs(_two_sweeps())
    assert abs(np.median(pairs["r"])) < 0.002  # the second sweep's 3% shift is taken out
    far = model.bin(5.0)  # most of the synthetic configs lie beyond 1.5x the best
    assert far.sigma == pytest.approx(0.01, rel=0.2)
    assert far.tail_share == pytest.approx(0.05, rel=0.35)
    assert far.tail_sigma == pytest.approx(0.3, rel=0.3)
    draws = np.array([model.draw(np.random.default_rng(s), 5.0) for s in range(3000)])
    assert np.median(np.log(draws)) == pytest.approx(0.0, abs=0.003)
    assert (draws > 1.1).mean() == pytest.approx(far.tail_share, abs=0.03)  # tails only ever slow
    assert (draws < 0.95).mean() < 0.01
    assert "pairs" in model.describe()


def test_no_repeated_pairs_is_a_clear_error():
    one = _two_sweeps(n=100)
    with pytest.raises(ValueError, match="repeated measurements"):
        fit_repeat_noise(one[one["sweep_id"] == 1])
    with pytest.raises(ValueError, match="lacks column"):
        fit_repeat_noise(one.drop(columns=["sweep_id"]))
