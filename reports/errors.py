"""Errors of the report renderer: one line naming the field or file and what is wrong (exit 2 at the CLI)."""

from __future__ import annotations

from rankscope.spine import InputError


class ReportInputError(InputError):
    """A verdict or evidence input the report cannot use; the message names the field and what is wrong."""
