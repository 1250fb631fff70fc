"""What every ``moetune`` command shares: --version, -h, the short flags, a repeatable --kernel."""

import pytest
import typer
from typer.testing import CliRunner

from moetune import __version__
from moetune.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)
ONE_OP = {"pick", "plot"}  # commands about one op: --kernel names it once


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def _option(command: str, name: str) -> typer.core.TyperOption | None:
    params = typer.main.get_command(app).commands[command].params
    return next((p for p in params if isinstance(p, typer.core.TyperOption) and name in p.opts), None)


def test_version(cli):
    res = cli("--version")
    assert res.exit_code == 0 and res.output.strip() == f"moetune {__version__}"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_dash_h_is_help_on_every_command(cli, command):
    args = [command] if command else []
    short, long = cli(*args, "-h"), cli(*args, "--help")
    assert short.exit_code == 0 and "Usage" in short.output, short.output
    assert short.output == long.output


def test_every_command_has_the_same_short_flags():
    with_kernel = [c for c in COMMANDS if _option(c, "--kernel")]
    with_model = [c for c in COMMANDS if _option(c, "--model")]
    assert {"sweep", "results", "export", "show", "pick", "bench", "plot", "replay"} <= set(with_kernel)
    assert {"sweep", "bench", "plot", "pick"} <= set(with_model)
    for c in with_kernel:
        assert "-k" in _option(c, "--kernel").opts, c
    for c in with_model:
        assert "-m" in _option(c, "--model").opts, c


def test_kernel_repeats_wherever_a_command_takes_several():
    for c in COMMANDS:
        opt = _option(c, "--kernel")
        if opt is not None:
            assert opt.multiple == (c not in ONE_OP), c


def test_sweep_help_shows_the_default_strategy_and_budget(cli):
    from moetune.tuner.strategies import DEFAULT_STRATEGY, STRATEGIES
    from moetune.tuner.strategies.adaptive import DEFAULT_FRACTION, MIN_BUDGET, AdaptiveStrategy

    res = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    flat = " ".join(res.output.replace("│", " ").split())
    assert res.exit_code == 0
    assert f"[default: {DEFAULT_STRATEGY}]" in flat, flat
    adaptive = sorted(n for n, s in STRATEGIES.items() if issubclass(s, AdaptiveStrategy))
    assert adaptive == ["coordinate", "model", "prior"]  # the help names these as the budgeted ones
    # the budgeted strategies' default is a grid budget: their per-point shares added up
    assert "--grid-budget" in flat and "[default: prior" in flat, flat
    assert f"{DEFAULT_FRACTION:.0%} of each point's candidates, at least {MIN_BUDGET}" in flat, flat
    assert f"prior {STRATEGIES['prior'].grid_share:.1%}" in flat
    assert "random and exhaustive every candidate" in flat
