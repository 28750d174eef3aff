"""Who a piece of evidence belongs to, and how we know: :class:`Identity` with its provenance.

Every evidence file (a stack dump, a log, a Flight Recorder dump, an error file) is resolved to
``(snapshot, rank, local_rank, node, role, pid)``. Each field records where it came from, in the order
the resolver trusts them:

``manifest``     a ``manifest.csv`` row (at any depth, scoped to its folder)
``hook``         the in-process hook's identity file (``pid<PID>.json``)
``log``          the line prefix or the launcher's summary in a log (``[rank3]:``, ``host : gpu-7``)
``cmdline``      ``--local-rank=N`` / ``LOCAL_RANK=N`` in the process's command line
``path``         a ``rank<N>`` / ``local_rank<N>`` token in the file's path, a torchrun ``--log-dir``
                 ``attempt_<k>/<local_rank>/`` folder, a ``snapshot-<N>/`` folder
``host-folder``  the folder directly above per-rank files (or a per-host log's name): a machine name
``pid-order``    sibling trainers of one host numbered by pid (torchrun starts them in local-rank order)
``host-order``   a global rank computed as ``host index * gpus_per_node + local rank`` over the
                 sorted host names (assumed; a manifest or hook identity says otherwise)
``inferred``     ``node-<rank // gpus_per_node>``: nobody named the machine

The user's machine names (manifest, hook, logs, host folders, timings/metrics node columns) always
win over ``inferred`` ones; a layout gives coordinates, never names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

PROVENANCES = ("manifest", "hook", "log", "cmdline", "path", "host-folder", "pid-order", "host-order", "inferred")
"""Where an identity field can come from, most trusted first."""

NAMED_SOURCES = frozenset({"manifest", "hook", "log", "host-folder", "timings", "metrics", "header"})
"""Provenances of a node name the user gave (a machine name to act on), as opposed to ``inferred``."""


_NO_SOURCES: Mapping[str, str] = MappingProxyType({})


class Identity(NamedTuple):
    """One process's (or one file's) place in the job, field by field, with where each field came from.

    A tuple, not a dataclass: one is built per process, 100,000 of them for a large job."""

    snapshot: int = 0
    rank: int | None = None
    local_rank: int | None = None
    node: str | None = None
    role: str | None = None
    pid: int | None = None
    sources: Mapping[str, str] = _NO_SOURCES  # field name -> provenance (see PROVENANCES)

    def source(self, name: str) -> str | None:
        """Where field ``name`` came from, or None when it is unset."""
        return self.sources.get(name) if getattr(self, name) is not None else None

    def with_field(self, name: str, value: Any, provenance: str) -> Identity:
        """A copy with ``name`` set to ``value`` (``None`` leaves it unchanged), recorded as from ``provenance``."""
        if value is None:
            return self
        return self._replace(**{name: value}, sources={**self.sources, name: provenance})

    def fill(self, name: str, value: Any, provenance: str) -> Identity:
        """Set ``name`` only when it is still unknown (a less trusted source never overrides a better one)."""
        return self if getattr(self, name) is not None else self.with_field(name, value, provenance)

    @property
    def node_is_named(self) -> bool:
        """True when the machine name came from the user (not invented)."""
        return self.node is not None and self.sources.get("node") in NAMED_SOURCES

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)} ({v})" for k, v in self.sources.items() if getattr(self, k) is not None]
        return ", ".join(parts) or "unknown"


@dataclass(frozen=True)
class NodeName:
    """A machine name for one rank and where it came from (see :data:`NAMED_SOURCES`)."""

    node: str
    source: str
    where: str = ""  # the file that said so
