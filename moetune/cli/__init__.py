"""The ``moetune`` command. Each submodule of this package adds its commands to ``app``."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated

import typer

from moetune import __version__

app = typer.Typer(
    name="moetune",
    help="Tune, export and pick Triton MoE kernel tiles per GPU and route density.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # subcommands inherit it
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"moetune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Tune, export and pick Triton MoE kernel tiles per GPU and route density."""


for _mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def main() -> None:
    app()
