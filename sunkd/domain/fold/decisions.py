"""The fold of what sunkd decided and did, and what it records about itself:
transitions started and ended (the ownership phase), actions requested and their
outcomes (and the drain and hold marks that prove what sunkd wrote), pins, nodes
forgotten, source health, leadership terms, the config-file pools and archiving."""

from __future__ import annotations

from typing import Any

from sunkd.domain import authorship as marks
from sunkd.domain import forecast
from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    LeaderElected,
    LogArchived,
    NodeForgotten,
    OperatorPinned,
    PoolsConfigured,
    RecordedEvent,
    SlurmHookReceived,
    SourceHealth,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold.builder import Builder, NodeDraft, event_time
from sunkd.domain.slurmdgone import VERB_DELETE_NODE, VERB_SLURMD_CREATE
from sunkd.domain.state import (
    OWNER_NONE,
    SLURMD_CREATED_MAX,
    SOURCE_FRESH,
    ActionOutcome,
    OpenAction,
    OpenTransition,
    Phase,
    Pin,
    SourceState,
)


def _on_pools_configured(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    configured: PoolsConfigured = p
    b.configured_pools = configured.pools
    b.aware = True
    b.repool(event_time(event))


def _on_health(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    health: SourceHealth = p
    if b.sources is None:
        b.sources = dict(b.base.sources)
    source = health.source or subject
    previous = b.sources.get(source)
    since = at if previous is None or previous.status != health.status else previous.since
    last_fresh = previous.last_fresh_at if previous is not None else None
    if health.status == SOURCE_FRESH:
        last_fresh = at
    b.sources[source] = SourceState(health.status, health.cause, health.detail, since, last_fresh,
                                    event.epoch)


def pin(to: str | None, source: str, who: str, why: str, at: float) -> Pin | None:
    if to is None or to == "auto" or to == "":
        return None
    return Pin(to=to, who=who, why=why, at=at, source=source)


def _on_pinned(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    pinned: OperatorPinned = p
    d = b.draft(pinned.node or subject)
    d.pin = pin(pinned.to, "operator", pinned.who, pinned.why, at)


def _owner_phase(owner: str) -> Phase:
    if owner == wk.OWNER_SLURM:
        return Phase.SLURM
    if owner == wk.OWNER_KUBERNETES:
        return Phase.KUBERNETES
    return Phase.UNKNOWN


def _on_started(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    started: TransitionStarted = p
    d = b.draft(started.node or subject)
    d.transition = OpenTransition(
        transition_id=started.transition_id,
        pool=started.pool,
        from_owner=started.from_owner or OWNER_NONE,
        to_owner=started.to_owner,
        started_at=at,
        reason=started.reason,
    )
    d.phase = Phase.TO_K8S if started.to_owner == wk.OWNER_KUBERNETES else Phase.TO_SLURM
    d.since = at


def _on_ended(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    ended: TransitionCompleted | TransitionAborted = p
    d = b.draft(ended.node or subject)
    transition = d.transition
    if transition is None or transition.transition_id != ended.transition_id:
        return  # stale or foreign reference: the log keeps it, the state ignores it
    if isinstance(ended, TransitionCompleted):
        d.owner = transition.to_owner
        if transition.direction == "lend" and transition.pool:
            b.set_history(transition.pool, forecast.observe_lend(
                b.history(transition.pool), at - transition.started_at))
    else:
        d.owner = transition.from_owner
    d.phase = _owner_phase(d.owner)
    d.transition = None
    d.since = at
    if transition.is_move:
        d.last_move_at = at


def _on_requested(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    requested: ActionRequested = p
    d = b.draft(requested.node or subject)
    d.open_actions = {
        **d.open_actions,
        requested.action_id: OpenAction(
            action_id=requested.action_id,
            transition_id=requested.transition_id,
            side=requested.side,
            verb=requested.verb,
            node=requested.node or subject,
            attempt=requested.attempt,
            reason=requested.reason,
            args=requested.args,
            requested_at=at,
            seq=seq,
        ),
    }


def _on_outcome(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    subject = event.subject
    at = event_time(event)
    outcome: ActionSucceeded | ActionFailed = p
    d = b.draft(outcome.node or subject)
    key = f"{outcome.side}/{outcome.verb}"
    succeeded = isinstance(outcome, ActionSucceeded)
    if key in _MARKING:
        retryable = False if succeeded else outcome.retryable  # type: ignore[union-attr]
        _mark(d, key, d.open_actions.get(outcome.action_id), succeeded, retryable, at)
    if succeeded and key in _AUTHORING:
        _author(b, key, d.name, d.open_actions.get(outcome.action_id))
    if outcome.action_id in d.open_actions:
        open_actions = dict(d.open_actions)
        del open_actions[outcome.action_id]
        d.open_actions = open_actions
    d.outcomes = {
        **d.outcomes,
        key: ActionOutcome(
            action_id=outcome.action_id,
            transition_id=outcome.transition_id,
            succeeded=succeeded,
            attempt=outcome.attempt,
            at=at,
            seq=seq,
            error="" if succeeded else outcome.error,  # type: ignore[union-attr]
            retryable=False if succeeded else outcome.retryable,  # type: ignore[union-attr]
        ),
    }
    transition = d.transition
    if (
        succeeded
        and transition is not None
        and outcome.transition_id == transition.transition_id
        and key not in transition.done_verbs
    ):
        d.transition = transition._replace(
            done_verbs=tuple(sorted((*transition.done_verbs, key)))
        )


_MARKING = frozenset({marks.DRAIN, marks.UNDRAIN, marks.HOLD, marks.UNHOLD})
_CREATED = f"{wk.OWNER_KUBERNETES}/{VERB_SLURMD_CREATE}"
_DELETED_RECORD = f"{wk.OWNER_SLURM}/{VERB_DELETE_NODE}"
_AUTHORING = frozenset({_CREATED, _DELETED_RECORD})


def _author(b: Builder, key: str, name: str, action: OpenAction | None) -> None:
    """A slurmd pod sunkd created for Slurm node `name` under a Nodeset (the action's
    `nodeset_uid`) is recorded in `slurmd_created`; a defunct record sunkd deleted drops
    the name (the next create records it again)."""
    if action is None:
        return
    uid = next((label.value for label in action.args if label.key == "nodeset_uid"), "")
    if not uid:
        return
    names = b.created().get(uid, ())
    if key == _CREATED:
        if names and names[-1] == name:
            return
        kept = tuple(n for n in names if n != name)
        b.set_created(uid, (*kept, name)[-SLURMD_CREATED_MAX:])
    elif name in names:
        b.set_created(uid, tuple(n for n in names if n != name))


def _mark(d: NodeDraft, key: str, action: OpenAction | None, succeeded: bool,
          retryable: bool, at: float) -> None:
    """A drain or hold sunkd may have written (a success, or a retryable failure such as
    a timeout or an unconfirmed write, which may have landed) is marked as sunkd's; an
    undrain or unhold that succeeded drops the mark. A refusal wrote nothing."""
    if key == marks.DRAIN:
        if (succeeded or retryable) and action is not None:
            reason = marks.requested_reason(action.args, action.reason)
            d.drain_mark = marks.drain_written(reason, d.slurm, at)
    elif key == marks.HOLD:
        if succeeded or retryable:
            d.hold_mark = marks.hold_written(d.k8s, at)
    elif succeeded:  # an undrain or unhold (a failed one may have left the mark in place)
        if key == marks.UNDRAIN:
            d.drain_mark = marks.drain_lifted(d.drain_mark, d.slurm, at)
        else:
            d.hold_mark = None


def _on_forgotten(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    name = p.node or event.subject
    d = b.draft(name)
    if d.slurm is not None or d.k8s is not None or d.k8s_rivals:
        # Still observed (it left every pool): forget what sunkd did, keep what the
        # sources see, so a pool that takes it later starts from the live node.
        d.owner, d.phase, d.since, d.last_move_at = OWNER_NONE, Phase.UNKNOWN, None, None
        d.transition, d.pin, d.unpooled_since = None, None, None
        d.open_actions, d.outcomes = {}, {}
        d.drain_mark, d.hold_mark = None, None  # unproven from now on: foreign (fail closed)
        return
    b.drafts.pop(name, None)
    b.forgotten.add(name)
    names = b.k8s_names if b.k8s_names is not None else b.base.k8s_names
    stale = [k8s for k8s, slurm in names.items() if slurm == name or k8s == name]
    if stale:
        if b.k8s_names is None:
            b.k8s_names = dict(b.base.k8s_names)
        for k8s in stale:
            del b.k8s_names[k8s]


def _on_leader(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    elected: LeaderElected = p
    if elected.epoch >= b.leader_epoch:
        b.leader_epoch = elected.epoch
        b.leader_identity = elected.identity


def _on_archived(b: Builder, p: Any, seq: int, event: RecordedEvent) -> None:
    """`log.archived` changes nothing the policy decides on: archived events stay
    folded into the state (the archive's base snapshot holds them), so only `last_seq`
    moves, as for every event."""
    return None


HANDLERS: dict[type, Any] = {
    SourceHealth: _on_health,
    OperatorPinned: _on_pinned,
    TransitionStarted: _on_started,
    TransitionCompleted: _on_ended,
    TransitionAborted: _on_ended,
    ActionRequested: _on_requested,
    ActionSucceeded: _on_outcome,
    ActionFailed: _on_outcome,
    LeaderElected: _on_leader,
    PoolsConfigured: _on_pools_configured,
    LogArchived: _on_archived,
    NodeForgotten: _on_forgotten,
    SlurmHookReceived: lambda *_: None,  # a hint: the read it caused is what counts
}
