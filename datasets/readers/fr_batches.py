"""The state of a batched send/recv: PyTorch records each op of a ``batch_isend_irecv`` (a coalescing group:
Megatron's pipeline ``P2PCommunicator`` with ``batch_p2p_comm``, a context-parallel ring step) as its own
``nccl:send``/``nccl:recv`` entry with no CUDA events, then one ``nccl:coalesced`` entry of the same group and
p2p sequence id that carries the batch's events. The ops' entries therefore stay ``scheduled`` forever, long
after the batch completed ("duration doesn't get tagged onto individual ops yet, nor is their state updated",
PyTorch's own test of it); the batch's state is theirs."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from rankscope.datasets.domain.flight_recorder import FREntry

_OP = itemgetter(FREntry._fields.index("op"))
_P2P_OPS = frozenset(("send", "recv"))


def with_batch_states(entries: Sequence[FREntry]) -> Sequence[FREntry]:
    """``entries`` with each batched send/recv (``scheduled``, never started, not retired, followed by the
    ``coalesced`` entry of its group and p2p sequence id) given that entry's state, retirement and times;
    ``entries`` itself when the dump holds no ``coalesced`` entry (nearly always: one scan in C)."""
    if "coalesced" not in map(_OP, entries):
        return entries
    out = list(entries)
    waiting: dict[tuple[str, int], list[int]] = {}
    for i, e in enumerate(out):
        if e.op in _P2P_OPS and e.is_p2p:
            if e.state == "scheduled" and e.time_discovered_started_ns is None and not e.retired:
                waiting.setdefault((e.pg_name, e.p2p_seq_id), []).append(i)
        elif e.op == "coalesced" and e.p2p_seq_id:
            for j in waiting.pop((e.pg_name, e.p2p_seq_id), ()):
                out[j] = out[j]._replace(
                    state=e.state,
                    retired=e.retired,
                    time_discovered_started_ns=e.time_discovered_started_ns,
                    time_discovered_completed_ns=e.time_discovered_completed_ns,
                )
    return out
