"""The outbox's queue hands out exactly what the fold holds open, oldest first: the same
actions, in the same order, as a full scan (`ClusterState.pending_actions`), whatever the
history (hypothesis: requests, outcomes, aborts, forgotten nodes, re-requested ids, batches
of any split) and however it is asked (skips, limits, states it has not seen)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    NodeForgotten,
    Payload,
    RecordedEvent,
    TransitionAborted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.state import EMPTY, ClusterState
from sunkd.runtime.outbox import PRUNE_AT_LEAST, ActionQueue

NODES = ("n0", "n1", "n2")

step = st.one_of(
    st.tuples(st.just("request"), st.integers(0, 11), st.sampled_from(NODES),
              st.booleans()),
    st.tuples(st.just("succeed"), st.integers(0, 11)),
    st.tuples(st.just("fail"), st.integers(0, 11)),
    st.tuples(st.just("start"), st.sampled_from(NODES)),
    st.tuples(st.just("abort"), st.sampled_from(NODES)),
    st.tuples(st.just("forget"), st.sampled_from(NODES)),
)


def _payloads(steps: list[tuple[Any, ...]]) -> list[tuple[str, Payload]]:
    """(subject, payload) per step; actions belong to their node's open transition."""
    out: list[tuple[str, Payload]] = []
    nodes_of: dict[str, str] = {}
    transition: dict[str, str] = {}
    for i, item in enumerate(steps):
        verb = item[0]
        if verb == "request":
            _, n, node, by_subject = item
            # Ids are unique per node (sunkd's are unique per log position); the same id
            # again on its node is a re-request.
            action_id = f"a{n}{node}"
            nodes_of[action_id] = node
            # The node named by the payload, or (older logs) only by the subject.
            out.append((node, ActionRequested(
                action_id=action_id, transition_id=transition.get(node), side="slurm",
                verb="drain", node="" if by_subject else node)))
        elif verb in ("succeed", "fail"):
            action_id = next((a for a in nodes_of if a.startswith(f"a{item[1]}n")),
                             f"a{item[1]}n0")
            node = nodes_of.get(action_id, "n0")
            outcome: Payload = (ActionSucceeded(action_id=action_id, node=node)
                                if verb == "succeed" else
                                ActionFailed(action_id=action_id, node=node, error="x"))
            out.append((node, outcome))
        elif verb == "start":
            transition[item[1]] = f"t{i}"
            out.append((item[1], TransitionStarted(
                transition_id=f"t{i}", node=item[1], pool="p", from_owner="slurm",
                to_owner="kubernetes")))
        elif verb == "abort":
            out.append((item[1], TransitionAborted(
                transition_id=transition.pop(item[1], "t?"), node=item[1])))
        else:
            transition.pop(item[1], None)
            out.append((item[1], NodeForgotten(node=item[1], reason="gone")))
    return out


def _recorded(pairs: list[tuple[str, Payload]]) -> list[RecordedEvent]:
    return [RecordedEvent(seq=seq, recorded_at=datetime.fromtimestamp(seq, tz=UTC), epoch=1,
                          subject=subject, payload=payload)
            for seq, (subject, payload) in enumerate(pairs, start=1)]


def _batches(events: list[RecordedEvent], cuts: list[int]) -> list[list[RecordedEvent]]:
    bounds = sorted({0, len(events), *(c % (len(events) + 1) for c in cuts)})
    return [events[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60), st.lists(st.integers(0, 60), max_size=8),
       st.lists(st.integers(0, 11), max_size=4), st.integers(0, 20), st.booleans())
def test_runnable_is_the_full_scan(steps: list[tuple[Any, ...]], cuts: list[int],
                                   skipped: list[int], limit: int, ask_often: bool) -> None:
    events = _recorded(_payloads(steps))
    queue = ActionQueue()
    state: ClusterState = EMPTY
    skip_ids = {f"a{n}{node}" for n in skipped for node in NODES}
    for batch in _batches(events, cuts):
        state = fold(batch, state)
        queue.note(batch, state)
        if ask_often:  # dispatch after every fold, as the leader does
            expected = [a for a in state.pending_actions() if a.action_id not in skip_ids]
            assert queue.runnable(state, skip_ids.__contains__, limit) == expected[:limit]
    expected = [a for a in state.pending_actions() if a.action_id not in skip_ids]
    assert queue.runnable(state, skip_ids.__contains__, 100) == expected
    assert queue.runnable(state, lambda _: False, limit) == state.pending_actions()[:limit]


def test_a_state_the_queue_has_not_seen_is_scanned() -> None:
    """A loaded snapshot, or a state replaced behind the queue's back: rebuilt, not
    trusted."""
    events = _recorded(_payloads([("request", 1, "n0", False), ("request", 2, "n1", False)]))
    state = fold(events)
    queue = ActionQueue()
    queue.note(events[:1], fold(events[:1]))  # knows only the first request
    assert [a.action_id for a in queue.runnable(state, lambda _: False, 10)] == [
        "a1n0", "a2n1"]


def test_a_standby_keeps_only_about_what_is_open() -> None:
    """Nobody asks a standby's queue for work: closed entries must still go."""
    queue = ActionQueue()
    state: ClusterState = EMPTY
    for n in range(5 * PRUNE_AT_LEAST):
        batch = [RecordedEvent(seq=state.last_seq + 1 + i,
                               recorded_at=datetime.fromtimestamp(n, tz=UTC), epoch=1,
                               subject="n0", payload=payload)
                 for i, payload in enumerate((
                     ActionRequested(action_id=f"a{n}", side="slurm", verb="drain", node="n0"),
                     ActionSucceeded(action_id=f"a{n}", node="n0")))]
        state = fold(batch, state)
        queue.note(batch, state)
        assert len(queue) <= PRUNE_AT_LEAST + 1
    assert state.pending_actions() == []
