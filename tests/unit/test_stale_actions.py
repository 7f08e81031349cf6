"""An action belongs to its transition: once that transition has ended (aborted,
completed, or replaced by a new one) an action it requested and that has not run yet must
never run (a pin back to Kubernetes stops a reclaim *and* its eviction).
`stale_action` says so from the folded state alone; the engine closes such an action in
the log instead of running it (tests/contract/test_outbox_stale.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    K8sWorkloadObserved,
    Label,
    OperatorPinned,
    Payload,
    PodRef,
    RecordedEvent,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.policy import AbortTransition, stale_action
from sunkd.domain.state import OpenAction
from tests.unit.domain_world import POOL, Log, k8s_obs
from tests.unit.test_domain_policy import (
    T0,
    _actions,
    _cluster,
    _decide,
    _record,
)

NODES = ("n0", "n1")

step = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(NODES)),
    st.tuples(st.just("request"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("abort"), st.sampled_from(NODES)),
    st.tuples(st.just("complete"), st.sampled_from(NODES)),
    st.tuples(st.just("outcome"), st.integers(0, 30)),
)


def _model(steps: list[tuple[Any, ...]]) -> tuple[list[RecordedEvent], dict[str, bool]]:
    """The events of `steps`, and for every action requested: whether the transition it
    was requested in has ended since (kept by the test, independently of the fold)."""
    payloads: list[tuple[str, Payload]] = []
    open_tx: dict[str, str] = {}
    ended: dict[str, bool] = {}
    tx_of: dict[str, tuple[str, str | None]] = {}  # action -> (node, transition)
    for i, item in enumerate(steps):
        verb, *rest = item
        if verb == "start":
            node = rest[0]
            if node in open_tx:  # a new start replaces the open transition: it ended
                _end(open_tx[node], tx_of, ended)
            open_tx[node] = f"tx{i}"
            payloads.append((node, TransitionStarted(
                transition_id=f"tx{i}", node=node, pool=POOL, from_owner="slurm",
                to_owner="kubernetes")))
        elif verb == "request":
            node, in_transition = rest
            tx = open_tx.get(node) if in_transition else None
            tx_of[f"a{i}"] = (node, tx)
            ended[f"a{i}"] = False
            payloads.append((node, ActionRequested(
                action_id=f"a{i}", transition_id=tx, side="kubernetes", verb="evict",
                node=node)))
        elif verb in ("abort", "complete"):
            node = rest[0]
            if node not in open_tx:
                continue
            tx = open_tx.pop(node)
            _end(tx, tx_of, ended)
            kind = TransitionAborted if verb == "abort" else TransitionCompleted
            payloads.append((node, kind(transition_id=tx, node=node)))
        else:
            requested = sorted(tx_of)
            if not requested:
                continue
            action = requested[rest[0] % len(requested)]
            node, tx = tx_of[action]
            payloads.append((node, ActionSucceeded(action_id=action, transition_id=tx,
                                                   side="kubernetes", verb="evict",
                                                   node=node)))
    events = [RecordedEvent(seq=seq, recorded_at=datetime.fromtimestamp(seq, tz=UTC),
                            epoch=1, subject=subject, payload=payload)
              for seq, (subject, payload) in enumerate(payloads, start=1)]
    return events, ended


def _end(tx: str, tx_of: dict[str, tuple[str, str | None]], ended: dict[str, bool]) -> None:
    for action, (_node, action_tx) in tx_of.items():
        if action_tx == tx:
            ended[action] = True


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_an_open_action_is_stale_exactly_when_its_transition_has_ended(
        steps: list[tuple[Any, ...]]) -> None:
    events, ended = _model(steps)
    state = fold(events)
    for action in state.pending_actions():
        why = stale_action(action, state.nodes.get(action.node))
        assert (why is not None) == ended[action.action_id], (action, why)
        if why is not None:
            assert action.transition_id is not None and action.transition_id in why


def _reclaim_with_an_eviction_requested() -> tuple[Log, OpenAction]:
    """A lent node being reclaimed: tainted, its pod past reclaim_grace, the eviction
    asked for and not run yet."""
    log = _cluster(1, kubernetes=("n1",))
    log.add(K8sWorkloadObserved(node="n1", pool=POOL, pods=(PodRef("serving", "web-1",
                                                                   "Running"),)), 3.0)
    log.add(TransitionStarted(transition_id="tx-r", node="n1", pool=POOL,
                              from_owner="kubernetes", to_owner="slurm"), T0)
    log.add(ActionSucceeded(action_id="lock", transition_id="tx-r", side="kubernetes",
                            verb="lock", node="n1"), T0 + 1)
    log.add(k8s_obs("n1", tainted=True), T0 + 2)
    log.add(ActionRequested(action_id="evict", transition_id="tx-r", side="kubernetes",
                            verb="evict", node="n1", args=(Label("pod", "serving/web-1"),)),
            T0 + 121)
    return log, log.state().nodes["n1"].open_actions["evict"]


def test_a_pin_back_to_kubernetes_stops_the_reclaim_and_its_eviction() -> None:
    log, evict = _reclaim_with_an_eviction_requested()
    assert stale_action(evict, log.state().nodes["n1"]) is None  # the reclaim is open
    log.add(OperatorPinned(node="n1", to="kubernetes", who="alice", why="debug"), T0 + 122)
    aborted = _decide(log, T0 + 123)
    assert isinstance(aborted[0], AbortTransition) and "pinned" in aborted[0].reason
    _record(log, aborted, T0 + 123)
    node = log.state().nodes["n1"]
    action = node.open_actions[evict.action_id]
    why = stale_action(action, node)
    assert why is not None and evict.transition_id in why and "ended" in why
    # Closed in the log as the engine does: the lent node gets its taint off again.
    log.add(ActionFailed(action_id=evict.action_id, transition_id=evict.transition_id,
                         side="kubernetes", verb="evict", node="n1", error=why), T0 + 124)
    assert _actions(_decide(log, T0 + 125)) == [("n1", "kubernetes", "unlock")]

