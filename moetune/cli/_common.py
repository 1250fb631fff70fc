"""Helpers shared by the CLI commands: one clear error line and a non-zero exit, no traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    # Escaped: messages quote user input and shapes like "[tokens, 2]", which are not markup.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn ValueError/FileNotFoundError from the library into one error line."""
    try:
        yield
    except (ValueError, FileNotFoundError, PermissionError) as e:
        fail(str(e))


def split_list(text: str | None, cast=str) -> list:
    """"1,2, 4" -> [1, 2, 4]; None -> []."""
    if not text:
        return []
    try:
        return [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"cannot parse list {text!r}: {e}") from e
