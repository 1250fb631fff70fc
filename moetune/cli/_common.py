"""Helpers shared by the CLI commands: one clear error line and a non-zero exit, no traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from moetune.tuner.store import DEFAULT_PATH

console = Console()
err_console = Console(stderr=True)
DEFAULT_DB = DEFAULT_PATH  # git-ignored: a store is data, not source

_SHORT = {"BLOCK_SIZE_M": "BM", "BLOCK_SIZE_N": "BN", "BLOCK_SIZE_K": "BK", "GROUP_SIZE_M": "GM",
          "SPLIT_K": "SK", "ROWS_PER_PROGRAM": "R", "num_warps": "w", "num_stages": "s"}


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


def kernel_list(values: Iterable[str] | None) -> list[str]:
    """A repeated and/or comma separated ``--kernel``: ["a,b", "c"] -> ["a", "b", "c"]."""
    return [k for item in values or [] for k in split_list(item)]


def of_kernels(kernel: str, names: Iterable[str]) -> bool:
    """Is op ``kernel`` one of ``names``, or of one of those families?"""
    return any(kernel == n or kernel.startswith(n + ".") for n in names)


def fmt_config(config: dict) -> str:
    """Tile sizes first (BM BN BK GM), other keys as key=value, then warps and stages."""
    order = list(_SHORT)
    keys = sorted(config, key=lambda k: (order.index(k) if k in order[:4] else 4 if k not in order
                                         else order.index(k) + 1, k))
    return " ".join(f"{_SHORT[k]}{config[k]}" if k in _SHORT else f"{k}={config[k]}" for k in keys)


def check_kernels(names: Iterable[str]) -> None:
    """ValueError naming the first name that is neither a known op nor a family of ops."""
    from moetune.kernels import rules

    known = rules.known_names()
    for name in names:
        if not any(k == name or k.startswith(name + ".") for k in known):
            raise ValueError(rules.unknown_kernel(name))
