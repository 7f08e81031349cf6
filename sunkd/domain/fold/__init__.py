"""The fold: `ClusterState` is a pure function of the event log.

sunkd never keeps state that is not derivable from the log (docs/architecture.md):
the in-memory `ClusterState` is a cache of `fold(events)`, snapshots are
`state_to_json(fold(prefix))`, and a restart is `fold(tail, state_from_json(snapshot))`.
So the fold must be deterministic (no clock, no randomness: times come from each
event's `recorded_at`), total (unknown payloads and stale references are ignored,
never fatal) and fast enough to replay a million events in seconds.

The state's types are in `sunkd.domain.state`; the fold applies each event with the
handler its payload type names, one module per side: `slurm` (Slurm's observations),
`kubernetes` (Kubernetes' observations and pod reports), `decisions` (what sunkd
decided and did, and what it records about itself), all writing through the
copy-on-write `builder.Builder` (per-node drafts frozen at the end), so `fold` never
mutates its input and any earlier state stays valid as a snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sunkd.domain.events import Payload, RecordedEvent
from sunkd.domain.fold import decisions, kubernetes, slurm
from sunkd.domain.fold.builder import Builder, event_time
from sunkd.domain.state import EMPTY, ClusterState

_HANDLERS: dict[type[Payload], Any] = {
    **slurm.HANDLERS, **kubernetes.HANDLERS, **decisions.HANDLERS,
}


def fold(events: Iterable[RecordedEvent], state: ClusterState = EMPTY) -> ClusterState:
    """The state after applying `events` (in log order) to `state`.

    Events at or below `state.last_seq` are skipped, so folding an overlapping tail
    onto a snapshot is safe. Unknown payload types only advance `last_seq`.
    """
    builder = Builder(state)
    handlers = _HANDLERS
    last_seq = builder.last_seq
    last_event: RecordedEvent | None = None
    for event in events:
        seq = event.seq
        if seq <= last_seq:
            continue
        last_seq = seq
        last_event = event
        payload = event.payload
        handler = handlers.get(type(payload))
        if handler is not None:
            handler(builder, payload, seq, event)
            if builder.touched:
                builder.settle(event_time(event))
    builder.last_seq = last_seq
    if last_event is not None:
        builder.last_recorded_at = event_time(last_event)
    return builder.build()


def apply(state: ClusterState, event: RecordedEvent) -> ClusterState:
    """The state after one event. Prefer `fold` for batches: it copies containers once."""
    return fold((event,), state)
