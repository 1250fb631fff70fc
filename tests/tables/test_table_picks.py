"""tools/table_picks.py: which intervals between table entries the refine stage splits."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from table_picks import boundaries  # noqa: E402

from moetune.problem import canonical_json  # noqa: E402


def _entry(tokens, cfg):
    return {"tokens": tokens, "routes": 6 * tokens, "config": cfg}


def test_boundaries_split_only_intervals_where_a_pick_loses_across():
    a, b, c = {"BLOCK_SIZE_M": 16}, {"BLOCK_SIZE_M": 32}, {"BLOCK_SIZE_M": 64}
    entries = [_entry(256, a), _entry(512, a), _entry(1024, b), _entry(1536, c), _entry(2048, c)]
    t = {(r, canonical_json(cfg)): v for r, cfg, v in [
        (3072, a, 1.0), (3072, b, 1.02),    # a -> b: b only 2% off at a's density ...
        (6144, b, 1.0), (6144, a, 1.03),    # ... and a 3% off at b's: no boundary
        (6144, c, 1.5), (9216, c, 1.0), (9216, b, 1.04),  # b -> c: c 50% off at b's density: a boundary
    ]}
    found = boundaries(entries, t, gap=1.05)
    assert [f["between"] for f in found] == [(6144, 9216)]
    assert found[0]["routes"] == 6 * 1254  # the geometric midpoint, in whole tokens
    assert found[0]["ratios"] == [1.04, 1.5]
    # an interval without both cross measurements is skipped, not guessed
    del t[(9216, canonical_json(b))]
    assert boundaries(entries, t, gap=1.05) == []
