"""Routing draws: typical uniform draws hold the distinct-expert count at its expectation."""

import pytest
import torch

from moetune import routing
from moetune.routing import expected_distinct, make_routes


def _distinct(ids):
    return int(torch.unique(ids[ids >= 0]).numel())


@pytest.mark.parametrize("tokens,top_k,experts,active", [
    (1, 8, 256, 1.0), (16, 8, 256, 1.0), (7, 8, 256, 0.5), (64, 8, 256, 1.0), (128, 6, 256, 1.0),
    (3, 2, 8, 1.0)])
def test_typical_draws_read_the_expected_number_of_experts(tokens, top_k, experts, active):
    want = round(expected_distinct(tokens, round(top_k * active), experts))
    seen = set()
    for seed in range(4):
        ids, weights = make_routes(tokens, top_k, experts, active_fraction=active, typical=True,
                                   generator=torch.Generator().manual_seed(seed))
        assert _distinct(ids) == want
        assert ids.shape == weights.shape == (tokens, top_k) and ids.dtype == torch.int32
        assert ((ids >= 0).sum(dim=1) == round(top_k * active)).all()
        assert torch.allclose(weights.sum(dim=1), torch.ones(tokens))
        seen.add(tuple(ids.flatten().tolist()))
    assert len(seen) == 4  # still random: which experts, which tokens
    again, _ = make_routes(tokens, top_k, experts, active_fraction=active, typical=True,
                           generator=torch.Generator().manual_seed(3))
    assert tuple(again.flatten().tolist()) in seen  # and seeded


def test_typical_keeps_the_closest_draw_when_none_hits_and_leaves_other_routings_alone(monkeypatch):
    monkeypatch.setattr(routing, "TYPICAL_TRIES", 1)
    ids, _ = make_routes(40, 8, 256, typical=True, generator=torch.Generator().manual_seed(0))
    plain, _ = make_routes(40, 8, 256, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, plain)  # one try: that draw
    zipf = [make_routes(40, 8, 256, routing="zipf:1.2", typical=t,
                        generator=torch.Generator().manual_seed(0))[0] for t in (True, False)]
    assert torch.equal(*zipf)


def test_the_expectation():
    assert expected_distinct(1, 8, 256) == pytest.approx(8)
    assert expected_distinct(64, 8, 256) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 64))
    assert expected_distinct(10 ** 6, 6, 256) == pytest.approx(256)


def test_trace_errors_name_the_users_file(tmp_path):
    import numpy as np

    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a tensor file")
    for path in (pickled, garbage):
        with pytest.raises(ValueError) as err:
            routing.load_trace(path, 8, 2)
        text = str(err.value)
        assert text.startswith(f"cannot read trace file {path}: ") and "\n" not in text, text
