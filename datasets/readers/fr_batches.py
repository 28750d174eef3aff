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
    """``entries`` with each batched send/recv given its batch's state, retirement and times: the ``scheduled``
    (never started, not retired) send/recv entries that run, within their group, straight up to a ``coalesced``
    entry of the same p2p sequence id and collective sequence id (a collective batch's ``coalesced`` entry
    moves the collective one). ``entries`` itself when the dump holds no ``coalesced`` entry (nearly always:
    one scan in C)."""
    if "coalesced" not in map(_OP, entries):
        return entries
    out = list(entries)
    runs: dict[str, list[int]] = {}  # per group: the send/recv entries since its last other entry
    for i, e in enumerate(out):
        if e.op in _P2P_OPS and e.is_p2p:
            run = runs.setdefault(e.pg_name, [])
            if run and out[run[0]].p2p_seq_id != e.p2p_seq_id:
                run.clear()  # another batch, or single ops
            run.append(i)
            continue
        run = runs.pop(e.pg_name, [])
        if e.op != "coalesced" or not run or not _of_batch(out[run[0]], e):
            continue
        for j in run:
            m = out[j]
            if m.state == "scheduled" and m.time_discovered_started_ns is None and not m.retired:
                out[j] = m._replace(
                    state=e.state,
                    retired=e.retired,
                    time_discovered_started_ns=e.time_discovered_started_ns,
                    time_discovered_completed_ns=e.time_discovered_completed_ns,
                )
    return out


def _of_batch(op: FREntry, coalesced: FREntry) -> bool:
    return coalesced.p2p_seq_id == op.p2p_seq_id and coalesced.collective_seq_id == op.collective_seq_id
