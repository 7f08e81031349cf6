"""The outbox's queue: open actions in request order, without scanning every node.

Why: the leader dispatches after every fold, and `ClusterState.pending_actions` visits all
nodes and sorts what is open. During a first sync at 10,000 nodes (10,000 locks open at
once, dozens of folds a second) that scan was 16 % of the event loop's samples
(docs/performance.md, "Scale"), and it slowed the adoption it was dispatching.

An action is open from its `action.requested` until the fold closes it (an outcome, a
forgotten node). So the queue learns requests from the batches the engine folds, in seq
order (which is request order), and forgets an action when it finds the fold has closed
it. It never decides what is open: `runnable` hands out only actions the given state holds
open, so an entry the fold closed is skipped, never run. An action whose transition ended
before it ran is still open (nothing closed it yet): it is handed out, and the engine
closes it with an `action.failed` instead of running it (`policy.stale_action`). A queue
that does not know the state it is asked about (a freshly loaded or replaced state)
rebuilds itself from that state's full scan first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sunkd.domain.events import ActionRequested, RecordedEvent
from sunkd.domain.state import ClusterState, OpenAction

# Entries are pruned (the closed ones dropped) when the queue has grown past twice what
# was open at the last pruning, and at least this: a standby, which never dispatches,
# keeps only what is open.
PRUNE_AT_LEAST = 1024


class ActionQueue:
    """action_id -> node, in request order, for the open actions of one folded state."""

    def __init__(self) -> None:
        self._entries: dict[str, str] = {}
        self._upto = -1  # the state.last_seq this queue knows the requests up to
        self._prune_at = PRUNE_AT_LEAST

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._entries

    def rebuild(self, state: ClusterState) -> None:
        self._entries = {a.action_id: a.node for a in state.pending_actions()}
        self._upto = state.last_seq
        self._prune_at = max(PRUNE_AT_LEAST, 2 * len(self._entries))

    def note(self, batch: Iterable[RecordedEvent], state: ClusterState) -> None:
        """`state` is the fold of `batch` onto the state this queue knew."""
        if self._upto < 0:
            self.rebuild(state)
            return
        for event in batch:
            payload = event.payload
            if isinstance(payload, ActionRequested):
                # A re-request (a retry under the same id) goes to the back: seq order.
                self._entries.pop(payload.action_id, None)
                self._entries[payload.action_id] = payload.node or event.subject
        self._upto = state.last_seq
        if len(self._entries) > self._prune_at:
            self._entries = {action_id: node for action_id, node in self._entries.items()
                             if _open(state, node, action_id) is not None}
            self._prune_at = max(PRUNE_AT_LEAST, 2 * len(self._entries))

    def runnable(self, state: ClusterState, skip: Callable[[str], bool],
                 limit: int) -> list[OpenAction]:
        """Up to `limit` actions `state` holds open and `skip` does not, oldest first."""
        if state.last_seq != self._upto:
            self.rebuild(state)
        found: list[OpenAction] = []
        closed: list[str] = []
        if limit > 0:
            for action_id, node in self._entries.items():
                action = _open(state, node, action_id)
                if action is None:
                    closed.append(action_id)
                elif not skip(action_id):
                    found.append(action)
                    if len(found) >= limit:
                        break
        for action_id in closed:
            del self._entries[action_id]
        return found


def _open(state: ClusterState, node: str, action_id: str) -> OpenAction | None:
    record = state.nodes.get(node)
    return record.open_actions.get(action_id) if record is not None else None
