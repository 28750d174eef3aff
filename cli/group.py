"""The command group behind ``rankscope``: commands loaded on first use, one-line usage errors, lean values.

typer stays the declared CLI (each command is a typed function in ``cli/<name>.py``); this click group
under it does three things typer does not do by itself:

- **Lazy commands.** :data:`rankscope.cli.main.COMMANDS` names each command's module and its one-line
  help; ``rankscope --help`` lists them from that table and imports no command module, and
  ``rankscope diagnose ...`` imports ``cli/diagnose.py`` only (each module imports its library code
  inside the command body). A module registers its commands with ``register(app)``, as before.
- **One-line usage errors.** A bad flag, a missing argument or an unknown command is one
  ``rankscope: error: ...`` line on stderr and exit code 2 (the error edge's format), never click's
  three-line usage block or a rich box.
- **Values without pydantic.** typer 0.29 builds a pydantic ``TypeAdapter`` per parameter on first use;
  importing pydantic and building the adapters cost ~0.1 s of every command's start. Parameters of plain
  types (str, int, float, bool, Path, Enum, optionally None) are converted here with typer's own
  choice and path helpers, and give the same error messages; any other parameter keeps typer's adapter.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from typer import _click  # typer 0.29 vendors click (Command, Context, HelpFormatter, ClickException)
from typer._click.exceptions import BadParameter, NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

try:  # typer's runtime coercion (0.29); older typers convert with click types and need nothing here
    from typer._coercion import RuntimeParam
    from typer._param_types import coerce_cli_choice, coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None  # type: ignore[assignment,misc]

LazyCommands = Mapping[str, tuple[str, str]]
"""name -> (module that registers it, one-line help shown by ``rankscope --help``)."""


class RankscopeGroup(TyperGroup):
    """The root group: eager commands (``register(app)`` at import) plus the lazy ones of ``lazy_commands``."""

    lazy_commands: LazyCommands = {}

    # -- commands ------------------------------------------------------------------------------------
    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        lean_values(self, ctx)  # the group's own options (--version, --help)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*self.lazy_commands, *(n for n in self.commands if n not in self.lazy_commands)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in self.lazy_commands:
            cmd = load_command(self.lazy_commands[cmd_name][0], cmd_name)
            self.commands[cmd_name] = cmd
        if cmd is not None:
            lean_values(cmd, ctx)
        return cmd

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy_commands:
                rows.append((name, self.lazy_commands[name][1]))
            elif not self.commands[name].hidden:
                rows.append((name, self.commands[name].get_short_help_str()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        try:
            return self._click_resolve_command(ctx, args)
        except UsageError as exc:
            close = difflib.get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if close:
                exc.message = f"{exc.message.rstrip('.')}; did you mean {' or '.join(map(repr, close))}?"
            raise

    # -- errors --------------------------------------------------------------------------------------
    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        if extra.get("standalone_mode") is False:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, **extra)
        extra["standalone_mode"] = False
        try:
            rv = super().main(args, prog_name, **extra)
        except NoArgsIsHelpError as exc:
            print(exc.format_message())
            sys.exit(0)
        except UsageError as exc:
            argv = list(sys.argv[1:] if args is None else args)
            sys.exit(usage_error(exc, next((a for a in argv if a in self.lazy_commands or a in self.commands), None)))
        except _click.ClickException as exc:
            print(f"rankscope: error: {one_line(exc.format_message())}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("rankscope: aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def usage_error(exc: UsageError, command: str | None) -> int:
    """Print a usage error (of ``command``, when one was named) as one line on stderr; the exit code (2)."""
    names = []
    ctx = exc.ctx
    while ctx is not None and ctx.parent is not None:  # the subcommand(s) the error happened in
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    names = names[::-1] or ([command] if command else [])
    where = " ".join(names)
    help_cmd = " ".join(["rankscope", *names, "--help"])
    print(
        f"rankscope: error: {where + ': ' if where else ''}{one_line(exc.format_message())} (see '{help_cmd}')",
        file=sys.stderr,
    )
    return exc.exit_code


def load_command(module: str, name: str) -> _click.Command:
    """Import ``module``, let it ``register`` its commands on a scratch app, and return command ``name``."""
    mod = importlib.import_module(module)
    scratch = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
    mod.register(scratch)
    group = typer.main.get_group(scratch)
    cmd = group.commands.get(name)
    if cmd is None:
        raise RuntimeError(f"{module}.register() defines no command {name!r}")
    return cmd


# -- values without pydantic ----------------------------------------------------------------------------
def lean_values(cmd: _click.Command, ctx: _click.Context | None) -> None:
    """Give each plain-typed parameter of ``cmd`` (its ``--help`` too: click makes it per context, with the
    names ``ctx`` inherits) the converter below, once per command."""
    if RuntimeParam is None or getattr(cmd, "_rankscope_lean", False):
        return
    params = list(cmd.params)
    if ctx is not None:
        help_option = cmd.get_help_option(ctx)
        params += [help_option] if help_option is not None else []
    for param in params:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(param, "_runtime_param", "absent") is not None:
            continue
        convert = _converter(desc.annotation, desc.parameter_info)
        if convert is not None:
            param._runtime_param = LeanValue(  # type: ignore[attr-defined]
                parameter_info=desc.parameter_info, annotation=desc.annotation, convert=convert
            )
    cmd._rankscope_lean = True  # type: ignore[attr-defined]


Converter = Callable[[Any, Any, Any], Any]  # (value, param, ctx) -> value


def _converter(annotation: Any, info: Any) -> Converter | None:
    """A converter for a plain annotation with no constraints typer would enforce; None keeps typer's."""
    if any(getattr(info, a, None) is not None for a in ("parser", "click_type", "min", "max")):
        return None
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices = tuple(annotation)

        def choice(value: Any, param: Any, ctx: Any) -> Any:
            try:
                return coerce_cli_choice(value, choices=choices, case_sensitive=info.case_sensitive, ctx=ctx)
            except ValueError as exc:
                raise BadParameter(str(exc), ctx=ctx, param=param) from None

        return choice
    if annotation is str:
        return lambda value, param, ctx: value if isinstance(value, str) else str(value)
    if annotation in (int, float):
        return _number(annotation)
    if annotation is bool:
        return _boolean
    if isinstance(annotation, type) and issubclass(annotation, Path):
        path_type = info.path_type or annotation

        def path(value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, (str, os.PathLike)) and isinstance(path_type, type) and issubclass(path_type, Path):
                value = path_type(value)  # typer's checks (exists, dir_okay, ...) then run without pydantic
            return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)

        return path
    return None


def _number(kind: type) -> Converter:
    word = "an integer" if kind is int else "a number"

    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
        try:
            return kind(str(value).strip())
        except ValueError:
            raise BadParameter(f"{value!r} is not {word}.", ctx=ctx, param=param) from None

    return convert


_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}


def _boolean(value: Any, param: Any, ctx: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise BadParameter(f"{value!r} is not a boolean (true/false).", ctx=ctx, param=param)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class LeanValue(RuntimeParam):
        """typer's runtime-parameter contract, converting with :func:`_converter`'s function."""

        convert: Converter = _boolean

        def _coerce_value(self, value: Any, param: Any, ctx: _click.Context) -> Any:
            return self.convert(value, param, ctx)
