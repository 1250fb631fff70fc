"""``moetune bench --layer``: the peers' method (graph of copies on their own weights), its bad input."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from moetune.cli import app
from moetune.kernels.rules import picked_routes
from moetune.tuner.layer_bench import LayerBenchOptions, bench_layer, graph_us


def test_the_layer_asks_the_picker_for_the_routes_the_hint_says_are_active():
    assert picked_routes(4, 8) == 32
    assert picked_routes(4, 8, 0.25) == 8
    assert picked_routes(64, 8, 0.0) == 512  # no active route: every route's (coarser) tiles
    assert picked_routes(1, 8, 0.01) == 8
    for bad in (-0.1, 1.5, float("nan"), True, "half"):
        with pytest.raises(ValueError, match="active_share"):
            picked_routes(4, 8, bad)


def test_options_refuse_empty_graphs():
    for field in ("copies", "replays"):
        with pytest.raises(ValueError, match=field):
            LayerBenchOptions(**{field: 0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_without_a_gpu_it_says_so_in_one_line():
    from moetune.models import get_model

    with pytest.raises(ValueError, match="needs a GPU"):
        bench_layer(get_model("tiny"), 1, [1])
    res = CliRunner().invoke(app, ["bench", "-m", "tiny", "--layer", "--tokens", "1", "--quiet"])
    assert res.exit_code != 0 and "needs a GPU" in res.output


def test_layer_needs_a_model():
    res = CliRunner().invoke(app, ["bench", "--layer", "--quiet"])
    assert res.exit_code != 0 and "--layer needs --model" in res.output


@pytest.mark.gpu
def test_graph_time_replays_every_launch_it_captured(device):
    a = torch.zeros(1024, device=device)
    calls = []

    def launch():
        calls.append(1)
        a.add_(1.0)

    opts = LayerBenchOptions(replays=5, warmup=3)
    assert graph_us([launch] * 8, opts) > 0
    assert len(calls) == 16  # each launch run once eagerly, once captured; replays never call Python
    assert a[0].item() == 8 * (1 + opts.warmup + opts.replays)  # the eager run, then every replay


@pytest.mark.gpu
def test_bench_layer_checks_and_times_a_small_model(device):
    from moetune.models import get_model

    res = bench_layer(get_model("tiny"), 1, [1, 4], [1.0, 0.5], LayerBenchOptions(copies=2, replays=3))
    assert [(r.tokens, r.active_fraction) for r in res.rows] == [(1, 1.0), (1, 0.5), (4, 1.0), (4, 0.5)]
    assert all(r.layer_us > 0 and r.gate_up_us > 0 and r.down_us > 0 and r.error < 1e-2 for r in res.rows)


def test_set_overrides_parse_and_bad_ones_fail_in_one_line():
    from moetune.cli.bench import _overrides

    assert _overrides(["PERSISTENT=4", "ALGO=grouped"]) == {"PERSISTENT": 4, "ALGO": "grouped"}
    for bad in ("PERSISTENT", "=4"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            _overrides([bad])
    res = CliRunner().invoke(app, ["bench", "-m", "tiny", "--layer", "--set", "PERSISTENT", "--quiet"])
    assert res.exit_code != 0 and "KEY=VALUE" in res.output


@pytest.mark.gpu
def test_bench_layer_applies_the_override_to_both_gemms(device):
    from moetune.models import get_model

    res = bench_layer(get_model("tiny"), 1, [4], [1.0, 0.0],
                      LayerBenchOptions(copies=2, replays=3, override={"PERSISTENT": 2}))
    assert all('"PERSISTENT":2' in r.gate_up_config and '"PERSISTENT":2' in r.down_config for r in res.rows)
    assert all(r.error < 1e-2 for r in res.rows)
