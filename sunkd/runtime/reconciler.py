"""The reconciler: fold the log into state, decide, append decisions, run the outbox.

One `Reconciler` lives for the whole process. It always *follows* the log (standbys
keep their read models and API current), and while the process holds the leadership
lease it also *leads* one term at a time: it calls the pure policy, appends the
decisions (fenced by the leader epoch), and executes requested actions through the
term's `ActionExecutor` (a term brings its own actuators: `LeaderTerm.executor`),
appending each outcome with `causation_seq` pointing at the request.

Crash safety comes from the log: an action is first appended as `action.requested`,
then executed, then its outcome appended. After a crash the fold still shows it
pending, and the next leader executes it again; every action is idempotent, so the
worst case is a harmless repeat (docs/architecture.md).

Determinism: the policy derives ids from `state.last_seq`, so the reconciler decides only
on a state that includes everything it appended itself (no decision is made twice
from the same position).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from sunkd.domain.events import (
    ActionFailed,
    ActionSucceeded,
    ConfiguredPool,
    Event,
    PoolsConfigured,
    RecordedEvent,
)
from sunkd.domain.fold import fold
from sunkd.domain.policy import (
    Decision,
    PoolSpec,
    decide,
    decision_to_event,
    effective_pools,
    stale_action,
)
from sunkd.domain.ports import ActionError, EventSink, RefusedError
from sunkd.domain.snapshot import state_from_json, state_to_json_text
from sunkd.domain.state import EMPTY, ClusterState, NodeState, OpenAction
from sunkd.runtime import malloc
from sunkd.runtime.forkencode import encode_in_child
from sunkd.runtime.groupcommit import GroupAppender
from sunkd.runtime.outbox import ActionQueue
from sunkd.store.eventlog import (
    SNAPSHOTS_KEPT,
    EventLog,
    JSONText,
    LogShrankError,
    StaleLeaderError,
    dumps_json,
)
from sunkd.store.projections import CorruptRow

log = structlog.get_logger(__name__)

# From this many nodes on, folding a batch, deciding and turning the state into a snapshot
# run in a worker thread (the state is immutable: every fold builds a new one), so the
# event loop keeps its turns for the lease renewal, the API and the sources (at
# 10,000 nodes each of these held the loop for seconds and a renewal came too late).
# Below it the work takes milliseconds and the hop to a thread would cost more.
OFFLOAD_NODES = 1000
# Decisions logged one by one per turn; beyond it one summary line (a first sync at
# 10,000 nodes decides 20,000 things at once, all of them in the log anyway).
DECISIONS_LOGGED = 50
# A decide that took this long is logged with its cost (a first sync, a big catch-up).
SLOW_DECIDE_S = 0.5
# At most this share of wall time goes to `decide`: after a decide that took d seconds
# the next waits d * (1 / DECIDE_SHARE - 1). Deciding holds the GIL (in a worker thread
# from OFFLOAD_NODES on), and after every folded batch it starved the event loop: at
# 2,000 nodes it took 30 % of the daemon's samples and the watches fell a minute behind
# (docs/performance.md, "Scale"). Deciding later is always safe: each decide reads the
# newest state, and acting is fenced by the term.
DECIDE_SHARE = 1 / 3
# Events handed to `defer` (a Slurm hook's `slurm.hook` record whose read changed
# nothing: sunkd/runtime/hooks.py) go into the log with the next append instead of a
# commit of their own; the lead loop appends them alone once the oldest has waited this
# long. At most DEFERRED_MAX wait; beyond, the oldest are dropped (they are diagnostics
# the fold ignores).
DEFERRED_SECONDS = 5.0
DEFERRED_MAX = 1000


class CorruptRowError(Exception):
    """The log has a row the fold cannot decode; deciding on a state that skipped it
    would be deciding on a lie, so the daemon stops and names the row."""

    def __init__(self, row: CorruptRow) -> None:
        super().__init__(row.describe())
        self.row = row


class ArchivedLogError(Exception):
    """The log's first seqs were archived and no snapshot covers them: a fold from
    nothing would be a state without that history."""


class LogWentBackwardsError(Exception):
    """The log ends before what this process has folded, or its first row changed: the
    database was recreated (or restored from an older backup) under the running process."""


async def locate_corrupt_row(event_log: EventLog, after_seq: int, error: BaseException,
                             upto: int | None = None) -> CorruptRowError:
    """Turn a failed read after `after_seq` into the CorruptRowError naming the row, or
    re-raise `error` when every row there decodes (the failure was something else)."""
    try:
        row = await event_log.first_corrupt_row(after_seq, upto)
    except Exception:
        row = None
    if row is None:
        raise error
    return CorruptRowError(row)


class ActionExecutor(Protocol):
    """Carries out one requested action; idempotent. Returns whether it changed
    anything; raises `ActionError` (retryable or not) when it could not."""

    async def execute(self, action: OpenAction, node: NodeState | None) -> bool: ...


class ReconcilerObserver(Protocol):
    """Hooks for metrics (`sunkd.api.metrics.Metrics` implements them): everything
    else, including action latency, is derived from the folded events themselves."""

    def observe_events(self, batch: Sequence[RecordedEvent]) -> None: ...
    def observe_loaded(self, state: ClusterState, pools: Sequence[PoolSpec], at: float
                       ) -> None: ...
    def observe_append(self, seconds: float) -> None: ...
    def set_fold_lag(self, events_behind: int) -> None: ...


@dataclass
class LeaderTerm:
    """What the reconciler needs to act as leader: the epoch, a validity check that is
    consulted before every side effect (a leader that cannot renew stops acting before
    its lease can be taken over), and the term's executor (None: decide, run nothing)."""

    epoch: int
    may_act: Callable[[], bool]
    # Still the leader, only not acting for now (a clock skew beyond the bound): the term
    # idles instead of ending. Defaults to "no": a term that may not act ends.
    paused: Callable[[], bool] = lambda: False
    executor: ActionExecutor | None = None


class Reconciler:
    def __init__(
        self,
        event_log: EventLog,
        *,
        config_pools: Sequence[PoolSpec] = (),
        snapshot_every: int = 1000,
        snapshots_kept: int = SNAPSHOTS_KEPT,
        snapshot_in_child: bool = False,
        tick_seconds: float = 1.0,
        max_concurrent_actions: int = 16,
        observer: ReconcilerObserver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.event_log = event_log
        self.config_pools = tuple(config_pools)
        self.snapshot_every = snapshot_every
        self.snapshots_kept = snapshots_kept
        self.snapshot_in_child = snapshot_in_child
        self.tick_seconds = tick_seconds
        self.max_concurrent_actions = max_concurrent_actions
        self.observer = observer
        self.clock = clock
        self.state: ClusterState = EMPTY
        self._changed = asyncio.Event()
        self._folded = asyncio.Condition()
        self._last_snapshot_seq = 0
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._finished: set[str] = set()  # outcome appended, maybe not folded yet
        self._queue = ActionQueue()  # the open actions in request order (outbox.py)
        self._outcomes: GroupAppender | None = None  # this term's (groupcommit.py: why)
        self._appended_upto = 0  # highest seq this process appended
        self._decided_upto = 0  # ... of them a decision (not an action's outcome)
        self._quiesced = False
        self._deferred: list[Event] = []  # `defer`: for the next append
        self._deferred_since = 0.0  # time.monotonic() of the oldest

    # ------------------------------------------------------------------ following

    async def load(self) -> None:
        """Latest snapshot plus the tail: restart is O(tail), not O(log)."""
        self.state, self._last_snapshot_seq = await load_state(self.event_log)
        # A snapshot is taken of rows the log held: a log that ends before its newest
        # snapshot (the archive's base among them) lost rows, and folding on would
        # append over them (a detached partition, a restore from an older backup).
        seen = max([self.state.last_seq, *await self.event_log.snapshot_seqs()])
        latest = await self.event_log.latest_seq()
        if latest < seen:
            raise LogShrankError(
                f"the event log ends at seq {latest}, but it has a snapshot at seq {seen}: "
                "rows are missing (a detached partition? a restore from an older backup?)")
        self.event_log.saw(seen)
        if self.observer is not None:
            try:  # busy/idle node-seconds go on from the loaded state
                self.observer.observe_loaded(self.state, self.pools(), self.clock())
            except Exception:  # metrics must never stop the fold
                log.exception("engine.observer_failed")
        log.info("engine.loaded", last_seq=self.state.last_seq, nodes=len(self.state.nodes),
                 from_snapshot=self._last_snapshot_seq)

    async def follow(self) -> None:
        """Fold every new event forever (leader and standby alike). A row that does not
        decode ends it with CorruptRowError naming the row."""
        try:
            async for batch in self.event_log.subscribe_batches(self.state.last_seq):
                await self._apply(batch)
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            # What a payload that is not JSON, not an object, or not of its kind's types
            # raises while being read (database errors are retried by the subscription).
            raise await locate_corrupt_row(self.event_log, self.state.last_seq,
                                           error) from error

    async def _apply(self, batch: list[RecordedEvent]) -> None:
        if len(self.state.nodes) >= OFFLOAD_NODES or len(batch) >= OFFLOAD_NODES:
            self.state = await asyncio.to_thread(fold, batch, self.state)
        else:
            self.state = fold(batch, self.state)
        self._queue.note(batch, self.state)
        if self.observer is not None:
            try:
                self.observer.observe_events(batch)
                self.observer.set_fold_lag(self._appended_upto - self.state.last_seq)
            except Exception:  # metrics must never stop the fold
                log.exception("engine.observer_failed")
        self._changed.set()
        async with self._folded:
            self._folded.notify_all()

    async def wait_folded(self, seq: int, within: float = 30.0) -> None:
        async with asyncio.timeout(within), self._folded:
            await self._folded.wait_for(lambda: self.state.last_seq >= seq)

    # -------------------------------------------------------------------- leading

    def pools(self) -> tuple[PoolSpec, ...]:
        return effective_pools(self.state, self.config_pools)

    def defer(self, events: Sequence[Event]) -> None:
        """Append `events` with the next append of this term, whatever it carries, or
        alone after DEFERRED_SECONDS: for records that change no state (the fold
        ignores them) and are not worth a commit (an fsync, and the write lock it holds)
        of their own. Lost if the term ends or the process stops before then."""
        if not events:
            return
        if not self._deferred:
            self._deferred_since = time.monotonic()
        self._deferred.extend(events)
        del self._deferred[:-DEFERRED_MAX]

    async def append(self, events: Sequence[Event], term: LeaderTerm) -> list[int]:
        """Append `events` (after what `defer` holds); their seqs."""
        deferred, self._deferred = self._deferred, []
        batch = [*deferred, *events] if deferred else events
        if not batch:
            return []
        started = time.perf_counter()
        seqs = await self.event_log.append(batch, term.epoch)
        if seqs:
            self._appended_upto = max(self._appended_upto, seqs[-1])
        if self.observer is not None:
            with contextlib.suppress(Exception):
                self.observer.observe_append(time.perf_counter() - started)
                self.observer.set_fold_lag(self._appended_upto - self.state.last_seq)
        return seqs[len(deferred):]

    def quiesce(self) -> None:
        """Stop deciding and starting actions (graceful shutdown); running ones go on."""
        self._quiesced = True

    async def lead(self, term: LeaderTerm) -> None:
        """Decide and execute until cancelled or the term ends (StaleLeaderError)."""
        decided_at_seq = -1
        caught_up = False  # both sources fresh in this term, at least once
        self._quiesced = False
        decide_at = 0.0  # time.monotonic(): no decide before (DECIDE_SHARE)
        owed = False  # a decide was put off by the pacing
        # The first decide on a view with both sources fresh is not paced: the ones
        # before it (on a view still waiting for its LIST) cannot act, and pacing on
        # their cost would put off a restart's first real decision by up to 2d.
        unpaced = False
        outcomes = self._outcomes = GroupAppender(functools.partial(self.append, term=term))
        self._deferred = []  # another term's: not ours to append
        try:
            while (term.may_act() or term.paused()) and not self._quiesced:
                wait = self.tick_seconds
                if owed:
                    wait = min(wait, max(0.0, decide_at - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._changed.wait()
                self._changed.clear()
                if term.paused():
                    continue  # leading, but not acting: nothing decided, nothing run
                if not term.may_act() or self._quiesced:
                    break
                if (self._deferred
                        and time.monotonic() - self._deferred_since >= DEFERRED_SECONDS):
                    await self.append([], term)  # nothing else came to carry them
                state = self.state
                # Actions already requested run whatever else is being decided, so a
                # busy cluster that always has something to decide never starves them.
                # Before both sources have reported fresh in this term the only ones are
                # the previous term's, decided on what that leader saw: they wait (I3;
                # this term decides nothing before then either). This also keeps a
                # restart's re-run from competing with its first LIST. Dispatch waits
                # for the fold of our own decisions (one may abort the transition an
                # action belongs to), not of our outcomes: an outcome only finishes its
                # action, which `_finished` skips. So freed slots refill while outcomes
                # stream in.
                if not caught_up and state.sources_fresh():
                    caught_up = unpaced = True
                if caught_up and state.last_seq >= self._decided_upto:
                    self._dispatch(state, term, outcomes)
                if state.last_seq < self._appended_upto:
                    continue  # our own decisions are not folded yet: decide after
                configured = configured_pools(self.config_pools)
                if state.configured_pools != configured:
                    # The fold learns the config-file pools from the log (a term's start,
                    # a SIGHUP reload); decide once it has folded them.
                    await self._decide_append([Event(
                        subject=CONFIG_SUBJECT, payload=PoolsConfigured(pools=configured))],
                        term)
                    continue
                owed = time.monotonic() < decide_at and not unpaced
                if owed:
                    continue  # paced: decide once the wait is over (or on a later change)
                now = self.clock()
                pools = self.pools()
                started = time.monotonic()
                if len(state.nodes) >= OFFLOAD_NODES:
                    decisions = await asyncio.to_thread(decide, state, pools, now)
                else:
                    decisions = decide(state, pools, now)
                seconds = time.monotonic() - started
                decide_at = time.monotonic() + seconds * (1 / DECIDE_SHARE - 1)
                unpaced = False
                if decisions and seconds >= SLOW_DECIDE_S:
                    log.info("engine.decided", decisions=len(decisions),
                             nodes=len(state.nodes), last_seq=state.last_seq,
                             seconds=round(seconds, 3))
                if not term.may_act() or self._quiesced:
                    continue  # decided on a term that stopped acting meanwhile
                if decisions and state.last_seq != decided_at_seq:
                    decided_at_seq = state.last_seq
                    _log_decisions(decisions)
                    await self._decide_append([decision_to_event(d) for d in decisions],
                                              term)
                await self._maybe_snapshot(state)
        finally:
            self._deferred = []
            if not self._quiesced:
                # The term ended (deposed, lease running out): stop acting at once.
                # A quiesced reconciler is being shut down gracefully by its owner, who
                # lets in-flight actions finish first.
                await self.drain_in_flight(grace_seconds=0)

    async def _decide_append(self, events: Sequence[Event], term: LeaderTerm) -> None:
        seqs = await self.append(events, term)
        if seqs:
            self._decided_upto = max(self._decided_upto, seqs[-1])

    def _dispatch(self, state: ClusterState, term: LeaderTerm,
                  outcomes: GroupAppender) -> None:
        in_flight, finished = self._in_flight, self._finished
        runnable = self._queue.runnable(
            state, lambda action_id: action_id in in_flight or action_id in finished,
            self.max_concurrent_actions - len(in_flight))
        if finished:
            self._finished = {a for a in finished if a in self._queue}  # outcomes folded
        for action in runnable:
            task = asyncio.create_task(self._run_action(action, term, outcomes),
                                       name=f"sunkd-action-{action.action_id}")
            self._in_flight[action.action_id] = task
            task.add_done_callback(functools.partial(self._forget_task, action.action_id))

    def _forget_task(self, action_id: str, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(action_id, None)

    async def _run_action(self, action: OpenAction, term: LeaderTerm,
                          outcomes: GroupAppender) -> None:
        if not term.may_act():
            return
        executor = term.executor
        if executor is None:
            return
        node = self.state.nodes.get(action.node)
        started = time.perf_counter()
        def failed(error: str, retryable: bool) -> ActionFailed:
            return ActionFailed(
                action_id=action.action_id, transition_id=action.transition_id,
                side=action.side, verb=action.verb, node=action.node, attempt=action.attempt,
                error=error, retryable=retryable)

        outcome: ActionSucceeded | ActionFailed
        # Right before running, on the latest fold (as `may_act` above): an action whose
        # transition ended since it was asked for (a pin aborting a reclaim) never runs.
        # It is closed in the log instead, not retried, and the policy decides afresh.
        stale = stale_action(action, node)
        if stale is not None:
            outcome = failed(stale, False)
            result = "stale"
            log.warning("engine.action_stale", action=action.action_id, verb=action.verb,
                        node=action.node, error=stale)
        else:
            try:
                changed = await executor.execute(action, node)
                outcome = ActionSucceeded(
                    action_id=action.action_id, transition_id=action.transition_id,
                    side=action.side, verb=action.verb, node=action.node,
                    attempt=action.attempt, changed=changed)
                result = "succeeded"
            except ActionError as error:
                outcome = failed(str(error), error.retryable)
                result = "refused" if isinstance(error, RefusedError) else "failed"
                log.warning("engine.action_failed", action=action.action_id,
                            verb=action.verb, node=action.node, error=str(error),
                            retryable=error.retryable)
            except Exception as error:  # an adapter bug must not kill the outbox
                outcome = failed(f"unexpected {type(error).__name__}: {error}", True)
                result = "failed"
                log.exception("engine.action_crashed", action=action.action_id)
        log.info("engine.action_done", action=action.action_id, verb=action.verb,
                 node=action.node, result=result,
                 seconds=round(time.perf_counter() - started, 3))
        event = Event(subject=action.node, payload=outcome, causation_seq=action.seq)
        try:
            await outcomes.append(event)  # the term's own: never another term's epoch
            self._finished.add(action.action_id)
        except StaleLeaderError:
            # The outcome is lost with our term; the next leader sees the action still
            # pending and repeats it (idempotent).
            log.warning("engine.outcome_fenced", action=action.action_id)

    async def drain_in_flight(self, grace_seconds: float) -> None:
        """Let running actions finish (bounded), then cancel the rest."""
        tasks = list(self._in_flight.values())
        if not tasks:
            return
        if grace_seconds > 0:
            await asyncio.wait(tasks, timeout=grace_seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._outcomes is not None:
            await self._outcomes.close()  # outcomes already queued are still written

    async def _maybe_snapshot(self, state: ClusterState) -> None:
        if state.last_seq - self._last_snapshot_seq < snapshot_interval(state,
                                                                        self.snapshot_every):
            return
        encode = functools.partial(state_to_json_text, state, dumps_json)
        started = time.perf_counter()
        big = len(state.nodes) >= OFFLOAD_NODES
        if big and self.snapshot_in_child:
            encoded = await encode_in_child(encode)  # forkencode.py says why a child
            text, where, child_mb = encoded.text, encoded.in_child, encoded.child_private_mb
            del encoded
        else:
            text = await asyncio.to_thread(encode) if big else encode()
            where, child_mb = False, None
        chars = len(text)
        await self.event_log.save_snapshot(state.last_seq, JSONText(text),
                                           keep=self.snapshots_kept)
        self._last_snapshot_seq = state.last_seq
        del text
        if big:
            await asyncio.to_thread(malloc.trim)  # forkencode.py, malloc.py: why
        log.info("engine.snapshot", seq=state.last_seq, chars=chars,
                 encoded_in_child=where, child_private_mb=child_mb,
                 seconds=round(time.perf_counter() - started, 3))


def _log_decisions(decisions: Sequence[Decision]) -> None:
    for decision in decisions[:DECISIONS_LOGGED]:
        log.info("engine.decision", kind=type(decision).__name__, node=decision.node,
                 reason=decision.reason)
    if len(decisions) > DECISIONS_LOGGED:
        kinds = Counter(type(decision).__name__ for decision in decisions[DECISIONS_LOGGED:])
        log.info("engine.decisions_more", count=len(decisions) - DECISIONS_LOGGED,
                 kinds=dict(sorted(kinds.items())), hint="all of them are in the event log")


# A snapshot costs O(nodes) to write (~3 KB a node) and saves folding the tail on restart
# (~300,000 events/s): past `snapshot_every`, wait for SNAPSHOT_EVENTS_PER_NODE events a
# node, so snapshot bytes stay O(1) per event at any size while a restart folds at most
# ~0.1 s of tail per 1,000 nodes (docs/performance.md, "Scale").
SNAPSHOT_EVENTS_PER_NODE = 10


def snapshot_interval(state: ClusterState, snapshot_every: int) -> int:
    """Events between two snapshots: `snapshot_every`, or more on a big cluster."""
    nodes = len(state.nodes) + len(state.unpooled)
    return max(snapshot_every, SNAPSHOT_EVENTS_PER_NODE * nodes)


async def load_state(event_log: EventLog, *, from_snapshot: bool = True,
                     upto: int | None = None, start: ClusterState = EMPTY,
                     on_corrupt: Callable[[CorruptRow], None] | None = None,
                     ) -> tuple[ClusterState, int]:
    """The state folded from the log (from the latest snapshot, when asked and readable,
    else from `start`, plus the tail, up to `upto` when given) and the seq of the
    snapshot used (0: none).

    A row that does not decode raises CorruptRowError naming it; with `on_corrupt`, the
    row is reported to it and skipped instead (for tools that show a damaged log)."""
    state, snapshot_seq = start, 0
    snapshot = await event_log.latest_snapshot() if from_snapshot else None
    if snapshot is not None and (upto is None or snapshot[0] <= upto):
        seq, body = snapshot
        try:
            state, snapshot_seq = state_from_json(body), seq
        except (KeyError, ValueError, TypeError) as error:
            # A snapshot is only a cache: an unreadable one (older format) costs a
            # full replay, never correctness.
            log.warning("engine.snapshot_unreadable", seq=seq, error=str(error))
    live = await event_log.live_range()
    if live is not None and live[0] > state.last_seq + 1:
        # Folding on would skip archived history (`sunkd log archive`) without a word.
        raise ArchivedLogError(
            f"the event log starts at seq {live[0]} (the seqs before were archived), but "
            f"the state to fold onto ends at seq {state.last_seq}: no readable snapshot "
            "covers the archived range (docs/operations.md, \"Retention\")")
    while True:
        position = state.last_seq
        try:
            async for batch in event_log.read_range(position, upto):
                state = fold(batch, state)
            return state, snapshot_seq
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            # The fast read failed on a row: find it, then (tolerant callers) fold the
            # page around it row by row and carry on after it.
            position = state.last_seq
            corrupt = await locate_corrupt_row(event_log, position, error, upto)
            if on_corrupt is None:
                raise corrupt from error
            page = await event_log.read_tolerant(position, corrupt.row.seq - position,
                                                 upto=corrupt.row.seq)
            good = [item for item in page if isinstance(item, RecordedEvent)]
            for item in page:
                if isinstance(item, CorruptRow):
                    on_corrupt(item)
            state = fold(good, state)
            # Past the bad row: later events fold onto the state without it.
            state = replace(state, last_seq=max(state.last_seq, corrupt.row.seq))


CONFIG_SUBJECT = "config"


def configured_pools(pools: Sequence[PoolSpec]) -> tuple[ConfiguredPool, ...]:
    """What the fold needs of the config-file pools: their membership rules, by name."""
    return tuple(ConfiguredPool(pool.name, pool.partitions, pool.node_selector, pool.nodes)
                 for pool in sorted(pools, key=lambda pool: pool.name))


def leader_sink(reconciler: Reconciler, term: LeaderTerm) -> EventSink:
    """The EventSink given to sources during a leadership term."""

    async def sink(events: Sequence[Event]) -> object:
        if not events:
            return []
        return await reconciler.append(events, term)

    return sink
