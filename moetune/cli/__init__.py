"""The ``moetune`` command. Each submodule of this package adds its commands to ``app``."""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(
    name="moetune",
    help="Tune, export and pick Triton MoE kernel tiles per GPU and route density.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def main() -> None:
    app()
