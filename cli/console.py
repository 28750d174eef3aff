"""The one console helper of the CLI: output, errors and exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rankscope.spine import RankscopeError
from rich.console import Console

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr and exit ``code`` (2 = bad input)."""
    print(f"rankscope: error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn rankscope's typed errors (and unreadable files) into one stderr line and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RankscopeError as exc:
            fail(str(exc))
        except OSError as exc:
            where = exc.filename or ""
            fail(f"{where}: {exc.strerror or exc}" if where else str(exc))
        return None

    return wrapper  # type: ignore[return-value]
