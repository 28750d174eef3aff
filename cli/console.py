"""The one console helper of the CLI: output, and the error edge (``rankscope.spine.error_edge``) on every command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console

from rankscope.spine import error_edge

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr and exit ``code`` (2 = bad input)."""
    print(f"rankscope: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Run a command inside the spine's error edge: rankscope errors and unreadable files are one stderr
    line and exit 2, Ctrl-C exit 130, anything else one line and exit 1 (RANKSCOPE_DEBUG=1: traceback)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with error_edge(passthrough=(typer.Exit, typer.Abort)):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]  # wraps() keeps the signature typer reads
