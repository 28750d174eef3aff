"""rankscope: find the faulty machine in a large distributed training job.

Layers, bottom to top (each imports only from the layers below it; see the README's table):

- ``rankscope.spine``: errors, atomic writes, paused GC, validators, the one error edge.
- ``rankscope.config``: the one configuration tree (flags > environment > file > defaults).
- ``rankscope.datasets``: domain types, the Parquet store, raw-format readers, loading a PATH.
- ``rankscope.models``: learned detectors, scikit-learn style.
- ``rankscope.analytics``: one subpackage per evidence source, one ``diagnose(inputs, config)``.
- ``rankscope.collectors``: everything that touches a live node or process.
- ``rankscope.reports``, ``rankscope.recovery``, ``rankscope.cli``: render and act on verdicts.
- ``rankscope.harness``: synthetic jobs, public data and the fault job, for tests, benchmarks and the demo.
"""

from __future__ import annotations

# Absolute, not relative: pytest imports this file as the root package of the checkout, whose folder
# name need not be a valid module name (a clone in ``rankscope-ci/``); the installed package resolves it.
from rankscope.spine import (
    ConfigError,
    InputError,
    LayoutError,
    LimitError,
    ParseError,
    RankscopeError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "InputError",
    "LayoutError",
    "LimitError",
    "ParseError",
    "RankscopeError",
    "StoreError",
    "__version__",
]
