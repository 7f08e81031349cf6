"""Prometheus metrics: how operators and alerts see sunkd without reading the log.

Most metrics are derived from the event stream itself: the daemon feeds every folded
event to `Metrics.observe_event`, which counts transitions, decisions, actions and
source trouble and times lends, reclaims and actions. So the numbers mean exactly what
the log says, and a standby that folds the same log exports the same counters. Gauges
of "where is every node now" come from `set_state(state, now, pools)` after each fold.
Process-level facts the log does not hold (append latency, fold lag, leadership) have
explicit setters.

Busy and idle node-seconds (`sunkd_node_seconds_total`, the figure the pool exists to
raise) come from the utilization fold (`sunkd.domain.utilization`) fed with the same
events, so they count event time, not scrape time: the engine seeds it with the loaded
state (`observe_loaded`), every folded event moves nodes between (pool, owner,
busy|idle), and each scrape accrues up to `now`. Like every counter here it restarts
at 0 with the process (Prometheus' `rate()`/`increase()` handle the reset); leader and
standby count alike.

Everything lives on a dedicated `CollectorRegistry` (`Metrics.registry`), never the
global default, so several daemons in one test process do not collide. Transition
reasons are free text; `reason_class` maps them to a small fixed vocabulary so label
cardinality stays bounded.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sunkd import __version__
from sunkd.domain.events import (
    ActionFailed,
    ActionRequested,
    ActionSucceeded,
    RecordedEvent,
    SourceHealth,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.ownership import assess, observed
from sunkd.domain.policy import PoolSpec, membership, unpooled_marks
from sunkd.domain.policy.slurmdfinalizer import ending_waits
from sunkd.domain.slurmddefunct import defunct_records
from sunkd.domain.state import ClusterState, Phase
from sunkd.domain.utilization import BUSY, IDLE, Key, Utilization, node_busy, node_counted

CONTENT_TYPE = CONTENT_TYPE_LATEST
NO_POOL = "none"  # pool label of nodes in no pool
PHASES = tuple(phase.value for phase in Phase)
OWNERS = ("slurm", "kubernetes", "none")

# Buckets for moves (drains can take hours) and for single actions (API calls).
MOVE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200)
ACTION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
# How many in-flight transitions/actions we remember start times of (bounded memory
# even if a log never ends what it starts).
_MAX_TRACKED = 100_000
_V = TypeVar("_V")

# Reason classes, first match wins. Keep in sync with docs/observability.md.
_REASON_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("drain_timeout", re.compile(r"drain_timeout|drain not finished", re.I)),
    ("held", re.compile(r"^held\b|\bheld:", re.I)),
    ("pinned", re.compile(r"\bpinn?ed\b|\bpin\b", re.I)),
    ("pool_mode", re.compile(r"pool mode", re.I)),
    ("action_failed", re.compile(r"\bfailed\b", re.I)),
    ("demand_gone", re.compile(r"demand gone|no longer", re.I)),
    ("adopt", re.compile(r"^adopt", re.I)),
    ("kubernetes_demand", re.compile(r"kubernetes demand|pending pods?|k8s demand", re.I)),
    ("slurm_demand", re.compile(r"slurm demand|pending jobs?", re.I)),
    ("minimum", re.compile(r"\bmin_(slurm|kubernetes)\b|\bmax_kubernetes\b", re.I)),
    ("completed", re.compile(r"drained|resumed|untainted|tainted|done", re.I)),
)


def reason_class(reason: str) -> str:
    """A bounded label for a free-text decision reason (`other` when nothing matches)."""
    for name, pattern in _REASON_CLASSES:
        if pattern.search(reason):
            return name
    return "other"


def direction(from_owner: str, to_owner: str) -> str:
    if from_owner == "slurm" and to_owner == "kubernetes":
        return "lend"
    if from_owner == "kubernetes" and to_owner == "slurm":
        return "reclaim"
    return "adopt"


class Metrics:
    """sunkd's metrics on their own registry. Not thread-safe: call from the loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge("sunkd_build_info", "sunkd version (value is always 1).",
                                ["version"], registry=r)
        self.build_info.labels(version=__version__).set(1)
        # --- state gauges (set_state)
        self.nodes = Gauge("sunkd_nodes", "Nodes per pool, owner and effective phase.",
                           ["pool", "owner", "phase"], registry=r)
        self.slurm_nodes = Gauge(
            "sunkd_slurm_nodes", "Nodes per pool and Slurm state (base state, +DRAIN).",
            ["pool", "state"], registry=r)
        self.open_transitions = Gauge("sunkd_transitions_open",
                                      "Transitions started and not ended, per direction.",
                                      ["direction"], registry=r)
        self.conflicts = Gauge(
            "sunkd_nodes_in_conflict",
            "Nodes where a Slurm job and a pod run at once (held; should always be 0).",
            ["pool"], registry=r)
        self.invalid_pins = Gauge(
            "sunkd_nodes_invalid_pin",
            "Nodes whose pin is not slurm|kubernetes|auto (not obeyed: the node stays put).",
            ["pool"], registry=r)
        self.gres_inconsistent = Gauge(
            "sunkd_nodes_gres_inconsistent",
            "Slurm-owned nodes held because Slurm's GRES is not their GPUs (GresConsistent).",
            ["pool"], registry=r)
        self.invalid_registrations = Gauge(
            "sunkd_nodes_invalid_registration",
            "Nodes held because slurmctld refused their slurmd registration (INVALID_REG: "
            "less than their NodeName= line).",
            ["pool"], registry=r)
        self.defunct_dynamic = Gauge(
            "sunkd_slurm_defunct_dynamic_nodes",
            "Dynamic Slurm node records of a Nodeset whose slurmd pod sunkd created, now "
            "DOWN+NOT_RESPONDING with no pod and their Kubernetes Node gone or unselected "
            "(sunkd deletes them on Slurm 23.02+; on 22.05 `sunkd status` gives the "
            "scontrol line).",
            ["nodeset"], registry=r)
        self.ending_waits = Gauge(
            "sunkd_nodeset_ending_waits",
            "Nodes of a Terminating Nodeset (or one whose spec.slurmd was removed) whose "
            "slurmd pod sunkd's finalizer still waits for, by why: busy (a job), "
            "terminating, unknown (pods, or Slurm's word), foreign (someone's DOWN), "
            "stale (sources).",
            ["pool", "why"], registry=r)
        self.quantity_unparsed = Gauge(
            "sunkd_nodes_quantity_unparsed",
            "Nodes whose allocatable cpu, memory or GPUs did not parse (capacity unknown).",
            ["pool"], registry=r)
        self.unpooled_marked = Gauge(
            "sunkd_nodes_unpooled_marked",
            "Nodes in no pool that still carry a drain or taint sunkd made (`sunkd status` "
            "says which and why).", registry=r)
        self.pending_actions = Gauge("sunkd_actions_pending",
                                     "Actions requested without an outcome (the outbox).",
                                     registry=r)
        self.source_up = Gauge("sunkd_source_fresh",
                               "1 when the source reports fresh data, else 0.",
                               ["source"], registry=r)
        self.source_age = Gauge(
            "sunkd_source_seconds_since_success",
            "Seconds since the source's last good poll or watch event.", ["source"],
            registry=r)
        self.nodes_activity = Gauge(
            "sunkd_nodes_activity",
            "Observed nodes per pool, owner and activity (state=busy: a Slurm allocation "
            "or a Running pool pod; idle otherwise).", ["pool", "owner", "state"], registry=r)
        self.last_event_age = Gauge("sunkd_last_event_age_seconds",
                                    "Seconds since the last folded event was recorded.",
                                    registry=r)
        # --- from the event stream (observe_event)
        self.events = Counter("sunkd_events_folded_total", "Events folded, by kind.",
                              ["kind"], registry=r)
        self.transitions_started = Counter(
            "sunkd_transitions_started_total", "Transitions started.",
            ["direction", "reason"], registry=r)
        self.transitions_completed = Counter(
            "sunkd_transitions_completed_total", "Transitions completed.",
            ["direction", "reason"], registry=r)
        self.transitions_aborted = Counter(
            "sunkd_transitions_aborted_total", "Transitions aborted.",
            ["direction", "reason"], registry=r)
        self.time_to_lend = Histogram(
            "sunkd_time_to_lend_seconds",
            "Lend duration: transition.started to transition.completed (slurm -> kubernetes).",
            registry=r, buckets=MOVE_BUCKETS)
        self.time_to_reclaim = Histogram(
            "sunkd_time_to_reclaim_seconds",
            "Reclaim duration: transition.started to completed (kubernetes -> slurm).",
            registry=r, buckets=MOVE_BUCKETS)
        self.actions_requested = Counter("sunkd_actions_requested_total", "Actions requested.",
                                         ["side", "verb"], registry=r)
        self.actions = Counter("sunkd_actions_total", "Action outcomes.",
                               ["side", "verb", "outcome"], registry=r)
        self.action_latency = Histogram(
            "sunkd_action_latency_seconds", "action.requested to its outcome.",
            ["side", "verb"], registry=r, buckets=ACTION_BUCKETS)
        self.source_errors = Counter(
            "sunkd_source_errors_total", "Sources turning stale or lost, by cause.",
            ["source", "cause"], registry=r)
        self.decisions = Counter(
            "sunkd_decisions_total",
            "Decisions recorded (transition start/complete/abort, action request) by reason.",
            ["decision", "reason"], registry=r)
        self.node_seconds = Counter(
            "sunkd_node_seconds",
            "Node-seconds per pool, owner (in transit: the side it comes from) and state "
            "(busy|idle), by event time since this process loaded the log.",
            ["pool", "owner", "state"], registry=r)
        self.leader_changes = Counter("sunkd_leader_elections_total",
                                      "leader.elected events folded.", registry=r)
        # --- process facts
        self.append_latency = Histogram(
            "sunkd_eventlog_append_seconds", "Latency of one event-log append (a batch).",
            registry=r, buckets=APPEND_BUCKETS)
        self.fold_lag = Gauge("sunkd_fold_lag_events",
                              "Events written to the log but not folded yet (written - folded).",
                              registry=r)
        self.leader = Gauge("sunkd_leader", "1 when this process is the leader.", registry=r)
        self.clock_offset = Gauge(
            "sunkd_clock_offset_seconds",
            "Database clock minus this host's clock, measured at the last lease renewal "
            "(beyond max_clock_skew_seconds the leader stops acting).", registry=r)
        self.leader_epoch = Gauge("sunkd_leader_epoch", "Leadership epoch seen by this process.",
                                  registry=r)
        self.terms_ended = Counter(
            "sunkd_leader_terms_ended_total",
            "Leadership terms of this process that ended, by cause (shutdown, lease_expired, "
            "deposed, kubernetes_lease, error).", ["cause"], registry=r)
        self.acquire_failures = Counter(
            "sunkd_leader_acquire_failures_total",
            "Attempts to acquire the lease that failed with an error (not: someone else "
            "holds it).", registry=r)
        self.extender_requests = Counter(
            "sunkd_extender_requests_total", "Scheduler extender calls by verb and result.",
            ["verb", "result"], registry=r)
        self.extender_latency = Histogram(
            "sunkd_extender_seconds", "Scheduler extender handling time.", ["verb"],
            registry=r, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.hook_events = Counter(
            "sunkd_slurm_hook_events", "Slurm hooks received, by event and result "
            "(docs/slurm.md, \"Hooks\").", ["event", "result"], registry=r)
        self.hook_lag = Histogram(
            "sunkd_slurm_hook_lag_seconds", "From a Slurm hook's sending to the "
            "observation its targeted read appended.", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self._transition_starts: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._action_starts: OrderedDict[str, float] = OrderedDict()
        self._source_good: dict[str, float] = {}
        # The sources whose appends the log refuses now (runtime/appends.py): not fresh,
        # whatever their last health event in the log says.
        self.append_failing: Callable[[], frozenset[str]] = frozenset
        self._gauge_keys: dict[str, set[tuple[str, ...]]] = {}
        self._utilization = Utilization()
        self._carried: dict[Key, float] = {}  # accrued by an earlier fold (re-seeded)
        self._exported: dict[Key, float] = {}  # what node_seconds already counts

    # ------------------------------------------------------------------ stream

    def observe_event(self, recorded: RecordedEvent) -> None:
        """Update counters and histograms from one folded event (call for every event,
        in log order, including the ones replayed at startup)."""
        payload = recorded.payload
        self.events.labels(kind=recorded.kind).inc()
        self._utilization.apply(recorded)  # node_seconds: exported per batch and scrape
        at = recorded.recorded_at.timestamp()
        if isinstance(payload, TransitionStarted):
            way = direction(payload.from_owner or "none", payload.to_owner)
            why = reason_class(payload.reason)
            self.transitions_started.labels(direction=way, reason=why).inc()
            self.decisions.labels(decision="start", reason=why).inc()
            _remember(self._transition_starts, payload.transition_id, (at, way))
        elif isinstance(payload, TransitionCompleted | TransitionAborted):
            way = direction(payload.from_owner or "none", payload.to_owner)
            why = reason_class(payload.reason)
            started = self._transition_starts.pop(payload.transition_id, None)
            if isinstance(payload, TransitionCompleted):
                self.transitions_completed.labels(direction=way, reason=why).inc()
                self.decisions.labels(decision="complete", reason=why).inc()
                if started is not None:
                    seconds = max(at - started[0], 0.0)
                    if way == "lend":
                        self.time_to_lend.observe(seconds)
                    elif way == "reclaim":
                        self.time_to_reclaim.observe(seconds)
            else:
                self.transitions_aborted.labels(direction=way, reason=why).inc()
                self.decisions.labels(decision="abort", reason=why).inc()
        elif isinstance(payload, ActionRequested):
            self.actions_requested.labels(side=payload.side, verb=payload.verb).inc()
            self.decisions.labels(decision="action", reason=payload.verb).inc()
            _remember(self._action_starts, payload.action_id, at)
        elif isinstance(payload, ActionSucceeded | ActionFailed):
            outcome = "succeeded" if isinstance(payload, ActionSucceeded) else "failed"
            self.actions.labels(side=payload.side, verb=payload.verb, outcome=outcome).inc()
            requested = self._action_starts.pop(payload.action_id, None)
            if requested is not None:
                self.action_latency.labels(side=payload.side, verb=payload.verb).observe(
                    max(at - requested, 0.0))
        elif isinstance(payload, SourceHealth):
            source = payload.source or recorded.subject
            if payload.status != "fresh":
                self.source_errors.labels(source=source,
                                          cause=payload.cause or payload.status).inc()
        elif recorded.kind == "leader.elected":
            self.leader_changes.inc()

    def observe_events(self, batch: Iterable[RecordedEvent]) -> None:
        for recorded in batch:
            self.observe_event(recorded)
        self._export_node_seconds()

    def observe_loaded(self, state: ClusterState, pools: Sequence[PoolSpec], at: float
                       ) -> None:
        """The engine loaded `state` (snapshot + tail) at `at`: busy/idle accrual goes
        on from there (nodes not moving are in the pool `pools` select)."""
        self._carried = dict(self._exported)
        self._utilization = Utilization.from_state(
            state, at, membership(state, pools) if pools else {})

    def _export_node_seconds(self) -> None:
        totals = self._utilization.totals
        for key in set(totals) | set(self._carried):
            value = self._carried.get(key, 0.0) + totals.get(key, 0.0)
            delta = value - self._exported.get(key, 0.0)
            if delta > 0:
                self.node_seconds.labels(*key).inc(delta)
                self._exported[key] = value

    # ------------------------------------------------------------------- state

    def set_state(self, state: ClusterState, now: float,
                  pools: Sequence[PoolSpec] = ()) -> None:
        """Set the per-node gauges from a folded state at time `now` (unix seconds).
        `pools` give node membership; nodes in no pool are labelled pool="none"."""
        members = membership(state, pools) if pools else {}
        counts: dict[tuple[str, ...], int] = {}
        slurm_counts: dict[tuple[str, ...], int] = {}
        moving: dict[tuple[str, ...], int] = {("lend",): 0, ("reclaim",): 0, ("adopt",): 0}
        conflicts: dict[tuple[str, ...], int] = {}
        invalid_pins: dict[tuple[str, ...], int] = {}
        gres_bad: dict[tuple[str, ...], int] = {}
        invalid_regs: dict[tuple[str, ...], int] = {}
        unparsed: dict[tuple[str, ...], int] = {}
        unpooled_marked = 0
        for name, node in state.nodes.items():
            if not observed(node):
                continue  # a pin of a node never observed is no node (yet)
            pool = members.get(name, NO_POOL)
            assessment = assess(state, node, now)
            if assessment.conflicts:
                conflicts[(pool,)] = conflicts.get((pool,), 0) + 1
            if pools and pool == NO_POOL and unpooled_marks(node):
                unpooled_marked += 1
            if assessment.invalid_pin is not None:
                invalid_pins[(pool,)] = invalid_pins.get((pool,), 0) + 1
            if assessment.gres_problem is not None:
                gres_bad[(pool,)] = gres_bad.get((pool,), 0) + 1
            if assessment.invalid_registration is not None:
                invalid_regs[(pool,)] = invalid_regs.get((pool,), 0) + 1
            if node.k8s is not None and node.k8s.unparsed:
                unparsed[(pool,)] = unparsed.get((pool,), 0) + 1
            key = (pool, node.owner, assessment.phase.value)
            counts[key] = counts.get(key, 0) + 1
            if node.slurm is not None:
                slurm_state = node.slurm.state.upper()
                if "DRAIN" in node.slurm.flags:
                    slurm_state += "+DRAIN"
                skey = (pool, slurm_state)
                slurm_counts[skey] = slurm_counts.get(skey, 0) + 1
            if node.transition is not None:
                dkey = (node.transition.direction,)
                moving[dkey] = moving.get(dkey, 0) + 1
        self._set_all("nodes", self.nodes, counts)
        activity: dict[tuple[str, ...], int] = {}
        for name, node in state.nodes.items():
            if node_counted(node):
                akey = (members.get(name, NO_POOL), node.owner,
                        BUSY if node_busy(node) else IDLE)
                activity[akey] = activity.get(akey, 0) + 1
        self._set_all("nodes_activity", self.nodes_activity, activity)
        self._utilization.advance(now)
        self._export_node_seconds()
        self._set_all("slurm_nodes", self.slurm_nodes, slurm_counts)
        self._set_all("open_transitions", self.open_transitions, moving)
        self._set_all("conflicts", self.conflicts, conflicts)
        self._set_all("invalid_pins", self.invalid_pins, invalid_pins)
        self._set_all("gres_inconsistent", self.gres_inconsistent, gres_bad)
        self._set_all("invalid_registrations", self.invalid_registrations, invalid_regs)
        self._set_all("quantity_unparsed", self.quantity_unparsed, unparsed)
        defunct: dict[tuple[str, ...], int] = {}
        for record in defunct_records(state):
            defunct[(record.pool,)] = defunct.get((record.pool,), 0) + 1
        self._set_all("defunct_dynamic", self.defunct_dynamic, defunct)
        waits: dict[tuple[str, ...], int] = {}
        for each in pools:
            nodeset = state.nodesets.get(each.name)
            if nodeset is None or not (nodeset.deleting or (
                    nodeset.slurmd is None and nodeset.slurmd_finalizer)):
                continue  # the common case: no member is looked at
            names = [n for n, p in members.items() if p == each.name and n in state.nodes]
            for why, count in ending_waits(
                    nodeset, [state.nodes[n] for n in sorted(names)],
                    sources_fresh=state.sources_fresh()).items():
                waits[(each.name, why)] = count
        self._set_all("ending_waits", self.ending_waits, waits)
        self.unpooled_marked.set(unpooled_marked)
        self.pending_actions.set(len(state.pending_actions()))
        refused = self.append_failing()
        for source, health in state.sources.items():
            fresh = health.status == "fresh" and source not in refused
            self.source_up.labels(source=source).set(1 if fresh else 0)
            marked = self._source_good.get(source)
            if marked is not None:
                good = marked
            elif fresh:
                # Sources append a health event only on change: "fresh" stands until
                # they report otherwise, so without marks a fresh source is good now.
                good = now
            else:
                good = health.last_fresh_at if health.last_fresh_at is not None else health.since
            self.source_age.labels(source=source).set(max(now - good, 0.0))
        if state.last_recorded_at is not None:
            self.last_event_age.set(max(now - state.last_recorded_at, 0.0))

    def mark_source_good(self, source: str, at: float) -> None:
        """Optional: a source had a good poll/watch event at `at` (unix seconds). Without
        it, a source whose last health event is `fresh` counts as good up to `now`."""
        self._source_good[source] = at

    def _set_all(self, key: str, gauge: Gauge, values: dict[tuple[str, ...], int]) -> None:
        """Set every labelled child and zero the ones that disappeared, so a pool or
        phase that empties reads 0 rather than its last value."""
        previous = self._gauge_keys.get(key, set())
        for labels in previous - set(values):
            gauge.labels(*labels).set(0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._gauge_keys[key] = previous | set(values)

    # ---------------------------------------------------------------- process

    def observe_append(self, seconds: float) -> None:
        """One event-log append (a batch) took `seconds`."""
        self.append_latency.observe(seconds)

    def set_fold_lag(self, events_behind: int) -> None:
        """Written seq minus folded seq."""
        self.fold_lag.set(max(events_behind, 0))

    def set_leader(self, is_leader: bool, epoch: int) -> None:
        self.leader.set(1 if is_leader else 0)
        self.leader_epoch.set(epoch)

    def observe_extender(self, verb: str, result: str, seconds: float) -> None:
        self.extender_requests.labels(verb=verb, result=result).inc()
        self.extender_latency.labels(verb=verb).observe(seconds)

    def render(self) -> bytes:
        """The text exposition format (Content-Type: `CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def metric_names(self) -> set[str]:
        """Every sample name this registry can export (with _total/_bucket/... suffixes
        and the family names), for checking dashboards and alerts."""
        names: set[str] = set()
        for family in self.registry.collect():
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
                names.add(family.name + "_created")
            elif family.type == "histogram":
                names.update(family.name + suffix
                             for suffix in ("_bucket", "_sum", "_count", "_created"))
            for sample in family.samples:
                names.add(sample.name)
        return names


def _remember(store: OrderedDict[str, _V], key: str, value: _V) -> None:
    store[key] = value
    if len(store) > _MAX_TRACKED:
        store.popitem(last=False)
