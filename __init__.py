"""rankscope: find the faulty machine in a large distributed training job.

Sub-packages, by role (imports point inward: datasets is the floor, cli the roof):

- ``rankscope.datasets``: Parquet schemas, the store, topology, raw-format readers, synthetic data.
- ``rankscope.analytics``: pure analysis (stack clustering, localization, verdicts).
- ``rankscope.models``: learned detectors, scikit-learn style.
- ``rankscope.collectors``: everything that touches a live node or process.
- ``rankscope.recovery``, ``rankscope.reports``, ``rankscope.cli``: act on and render verdicts.
"""

from __future__ import annotations

# Absolute, not relative: pytest imports this file as the root package of the checkout, whose folder
# name need not be a valid module name (a clone in ``rankscope-ci/``); the installed package resolves it.
from rankscope.spine import (
    InputError,
    LayoutError,
    ParseError,
    RankscopeError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = ["InputError", "LayoutError", "ParseError", "RankscopeError", "StoreError", "__version__"]
