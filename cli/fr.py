"""``rankscope fr PATH``: Flight Recorder dumps alone -> who did not join which collective.

The verdict is printed exactly as ``rankscope diagnose`` prints it (text or ``--format json``); the
selection options are ``torchfrtrace``'s: print the recorded entries (``-j``), of some ranks
(``--selected-ranks``) and process groups (``--pg-filters``), with their stacks (``--print-stack-trace``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rankscope.cli.console import echo, handle_errors
from rankscope.cli.options import (
    DEFAULT_ORDER,
    ConfigOpt,
    DumpedOnTimeoutOpt,
    Format,
    FormatOpt,
    GpusPerNodeOpt,
    JobOpt,
    LayoutOpt,
    OrderOpt,
    fr_flags,
    load_settings,
)

EXAMPLES = """\b
Examples:
  rankscope fr /shared/fr-dumps --layout tp=8,pp=4,dp=32
  rankscope fr /shared/fr-dumps -j --selected-ranks 0,3 --pg-filters default_pg --print-stack-trace
\b
torchfrtrace users: --selected-ranks, --pg-filters, -j/--just-print-entries and --print-stack-trace
select what is printed, as there; the verdict always uses every dump.
"""


def parse_ranks(text: str | None) -> set[int] | None:
    """``"0,3-5 7"`` -> {0, 3, 4, 5, 7}; None stays None."""
    from rankscope.spine import InputError

    if text is None:
        return None
    ranks: set[int] = set()
    for part in text.replace(",", " ").split():
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InputError(f"--selected-ranks {text!r}: {part!r} is not a rank or a range like 3-5") from None
        if a < 0 or b < a:
            raise InputError(f"--selected-ranks {text!r}: {part!r} is not a rank or a range like 3-5")
        ranks.update(range(a, b + 1))
    return ranks


def register(app: typer.Typer) -> None:
    @app.command("fr", epilog=EXAMPLES)
    @handle_errors
    def fr(
        path: Path = typer.Argument(
            ..., metavar="PATH", help="A directory of FR dumps (<prefix><rank>, pickle or JSON), or one file."
        ),
        layout: LayoutOpt = None,
        order: OrderOpt = DEFAULT_ORDER,
        gpus_per_node: GpusPerNodeOpt = None,
        prefix: str = typer.Option(
            None, "-p", "--prefix", metavar="PREFIX", help="Only files whose name starts with this prefix."
        ),
        job: JobOpt = None,
        fmt: FormatOpt = Format.text,
        just_print_entries: bool = typer.Option(
            False, "-j", "--just-print-entries", help="Also print the recorded entries, one column per rank."
        ),
        selected_ranks: str = typer.Option(
            None,
            "--selected-ranks",
            metavar="RANKS",
            help="Print the entries of these ranks only, e.g. 0,3-5 (implies -j).",
        ),
        pg_filters: str = typer.Option(
            None,
            "--pg-filters",
            metavar="GROUPS",
            help="Print the entries of these process groups only, by name or description, comma-separated "
            "(implies -j).",
        ),
        print_stack_trace: bool = typer.Option(
            False, "--print-stack-trace", help="Print the call stack recorded with each printed entry (implies -j)."
        ),
        max_entries: int = typer.Option(
            0, "--max-entries", metavar="N", help="Print only the last N entries per rank (0 = all)."
        ),
        dumped_on_timeout: DumpedOnTimeoutOpt = False,
        config: ConfigOpt = None,
    ) -> None:
        """Analyze Flight Recorder dumps alone, like torchfrtrace (gloo-safe).

        Missing ranks, mismatched collectives and the culprit machines, in the same verdict format as
        'rankscope diagnose'.
        """
        from rankscope.analytics import diagnose
        from rankscope.cli.diagnose import render
        from rankscope.datasets.loading.inputs import load_fr_inputs

        ranks = parse_ranks(selected_ranks)
        groups = [g.strip() for g in (pg_filters or "").split(",") if g.strip()]
        show = just_print_entries or print_stack_trace or ranks is not None or bool(groups)
        cfg = load_settings(config, fr_flags(dumped_on_timeout))
        inputs = load_fr_inputs(path, prefix=prefix, layout=layout, order=order, gpus_per_node=gpus_per_node, job=job)
        verdict = diagnose(inputs, cfg, sources=("flight_recorder",))
        if fmt is Format.json:
            out = verdict.to_dict()
            if show:
                from rankscope.reports.fr_text import entries_rows

                out["entries"] = entries_rows(inputs.fr_dumps, ranks=ranks, pg_filters=groups)
            echo(json.dumps(out, indent=2))
            return
        echo(render(verdict, fmt))
        if show:
            from rankscope.reports.fr_text import render_entries

            echo()
            echo(
                render_entries(
                    inputs.fr_dumps, ranks=ranks, pg_filters=groups, stacks=print_stack_trace, max_rows=max_entries
                )
            )
