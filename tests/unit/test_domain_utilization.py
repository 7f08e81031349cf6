"""The utilization fold (`sunkd.domain.utilization`) against a reference built on the
real fold: on random logs, every stretch between two events is classified by folding
the log up to it with `sunkd.domain.fold.fold` (owner as the fold says, busy from its
observations, pool from the last transition), and the incremental fold must give the
same seconds per (pool, owner, busy|idle), per node and per period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.events import (
    K8sNodeObserved,
    K8sNodeVanished,
    K8sWorkloadObserved,
    NodeForgotten,
    Payload,
    PodRef,
    RecordedEvent,
    SlurmNodeObserved,
    SlurmNodeVanished,
    TransitionAborted,
    TransitionCompleted,
    TransitionStarted,
)
from sunkd.domain.fold import fold
from sunkd.domain.state import EMPTY
from sunkd.domain.utilization import (
    BUSY,
    IDLE,
    NO_POOL,
    Key,
    Utilization,
    node_busy,
    node_counted,
)

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
NODES = ("n1", "n2", "n3")
K8S = ("k-n1", "k-n2", "k-n3")
POOLS = ("a/gpu", "b/cpu")


def recorded(seq: int, at: float, subject: str, payload: Payload) -> RecordedEvent:
    return RecordedEvent(seq=seq, recorded_at=T0 + timedelta(seconds=at), epoch=1,
                         subject=subject, payload=payload)


def log(*items: tuple[float, Payload]) -> list[RecordedEvent]:
    return [recorded(index + 1, at, getattr(payload, "node", "") or "x", payload)
            for index, (at, payload) in enumerate(items)]


# ------------------------------------------------------------------- examples


def test_a_lent_node_busy_then_idle_on_both_sides() -> None:
    events = log(
        (0, SlurmNodeObserved(node="n1", state="IDLE")),
        (0, K8sNodeObserved(node="k-n1", slurm_node="n1")),
        (10, TransitionStarted(transition_id="adopt", node="n1", pool="a/gpu",
                               from_owner="none", to_owner="slurm")),
        (10, TransitionCompleted(transition_id="adopt", node="n1", pool="a/gpu",
                                 from_owner="none", to_owner="slurm")),
        (100, SlurmNodeObserved(node="n1", state="ALLOCATED", alloc_cpus=8)),
        (400, SlurmNodeObserved(node="n1", state="IDLE", flags=("COMPLETING",))),
        (450, SlurmNodeObserved(node="n1", state="IDLE")),
        (500, TransitionStarted(transition_id="t1", node="n1", pool="a/gpu",
                                from_owner="slurm", to_owner="kubernetes")),
        (560, TransitionCompleted(transition_id="t1", node="n1", pool="a/gpu",
                                  from_owner="slurm", to_owner="kubernetes")),
        (600, K8sWorkloadObserved(node="k-n1", pool="a/gpu", pods=(
            PodRef("fn", "p1", phase="Running"),
            PodRef("kube-system", "agent", phase="Running", pool_pod=False)))),
        (900, K8sWorkloadObserved(node="k-n1", pool="a/gpu", pods=(
            PodRef("kube-system", "agent", phase="Running", pool_pod=False),))),
    )
    utilization = Utilization()
    utilization.apply_all(events)
    utilization.advance((T0 + timedelta(seconds=1000)).timestamp())
    assert utilization.totals == {
        Key(NO_POOL, "none", IDLE): 10.0,
        Key("a/gpu", "slurm", IDLE): 90.0 + 110.0,  # before the job; idle until lent
        Key("a/gpu", "slurm", BUSY): 350.0,  # ALLOCATED, then COMPLETING
        Key("a/gpu", "kubernetes", IDLE): 40.0 + 100.0,  # before the pod, after it
        Key("a/gpu", "kubernetes", BUSY): 300.0,  # the pool pod, not the agent
    }
    rows = {(row.pool, row.owner): row for row in utilization.rows()}
    assert rows[("a/gpu", "slurm")].busy_share == 350 / 550
    assert utilization.node_totals == {"n1": 1000.0}
    assert utilization.current() == {"n1": Key("a/gpu", "kubernetes", IDLE)}


def test_aborted_and_stale_ends_and_a_forgotten_node() -> None:
    events = log(
        (0, SlurmNodeObserved(node="n1", state="MIXED")),
        (0, TransitionStarted(transition_id="t1", node="n1", pool="a/gpu",
                              from_owner="slurm", to_owner="kubernetes")),
        (50, TransitionCompleted(transition_id="other", node="n1", from_owner="slurm",
                                 to_owner="kubernetes")),  # not the open one: ignored
        (100, TransitionAborted(transition_id="t1", node="n1", from_owner="slurm",
                                to_owner="kubernetes")),
        (200, SlurmNodeVanished(node="n1")),  # not counted while nobody observes it
        (300, SlurmNodeObserved(node="n1", state="IDLE")),
        (400, NodeForgotten(node="n1")),
    )
    utilization = Utilization()
    utilization.apply_all(events)
    utilization.advance((T0 + timedelta(seconds=1000)).timestamp())
    # In transit (0..100) the node counts for the side it comes from: the fold's owner
    # is still `none` there (never adopted), and the abort returns it to from_owner.
    # Forgotten while Slurm still observes it: it left every pool and is nobody's, but
    # still counted (as the fold keeps it); gone from both sides it would not be.
    assert utilization.totals == {Key("a/gpu", "none", BUSY): 100.0,
                                  Key("a/gpu", "slurm", BUSY): 100.0,
                                  Key("a/gpu", "slurm", IDLE): 100.0,
                                  Key(NO_POOL, "none", IDLE): 600.0}
    assert utilization.current() == {"n1": Key(NO_POOL, "none", IDLE)}


def test_a_period_clips_and_time_never_runs_backwards() -> None:
    events = log((0, SlurmNodeObserved(node="n1", state="ALLOCATED")),
                 (100, SlurmNodeObserved(node="n1", state="IDLE")))
    start = (T0 + timedelta(seconds=50)).timestamp()
    utilization = Utilization(start, start + 100)
    utilization.apply_all(events)
    utilization.advance(start + 1000)
    assert utilization.totals == {Key(NO_POOL, "none", BUSY): 50.0,
                                  Key(NO_POOL, "none", IDLE): 50.0}
    # An event recorded before the clock (a database clock behind the caller's) counts
    # as happening at the clock: nothing accrues twice or negatively.
    late = Utilization()
    late.apply(events[0])
    late.advance(T0.timestamp() + 100)
    late.apply(recorded(3, -1000.0, "n1",
                        SlurmNodeObserved(node="n1", state="IDLE")))
    late.advance(T0.timestamp() + 150)
    assert late.totals == {Key(NO_POOL, "none", BUSY): 100.0,
                           Key(NO_POOL, "none", IDLE): 50.0}


def test_from_state_continues_where_the_fold_is() -> None:
    events = log(
        (0, SlurmNodeObserved(node="n1", state="ALLOCATED")),
        (0, K8sNodeObserved(node="k-n2", slurm_node="n2")),
        (0, K8sWorkloadObserved(node="k-n2", pool="a/gpu",
                                pods=(PodRef("fn", "p", phase="Running"),))),
        (5, TransitionStarted(transition_id="t", node="n2", pool="b/cpu",
                              from_owner="none", to_owner="kubernetes")),
    )
    state = fold(events)
    at = (T0 + timedelta(seconds=10)).timestamp()
    seeded = Utilization.from_state(state, at, {"n1": "a/gpu"})
    assert seeded.current() == {"n1": Key("a/gpu", "none", BUSY),
                                "n2": Key("b/cpu", "none", BUSY)}
    seeded.apply(recorded(5, 30.0, "n2", TransitionCompleted(
        transition_id="t", node="n2", from_owner="none", to_owner="kubernetes")))
    seeded.advance(at + 30)
    assert seeded.totals == {Key("a/gpu", "none", BUSY): 30.0,
                             Key("b/cpu", "none", BUSY): 20.0,
                             Key("b/cpu", "kubernetes", BUSY): 10.0}


def test_a_forgotten_node_still_observed_keeps_its_pods_busy() -> None:
    """Forgetting a node that left every pool drops what sunkd did, not what the sources
    see: the pods its Kubernetes Node reported still run there, as the fold keeps them
    (found by the property below)."""
    events = log(
        (0.0, K8sNodeObserved(node="k-n1", slurm_node="n1")),
        (0.0, SlurmNodeVanished(node="n1")),
        (0.0, K8sWorkloadObserved(node="k-n1", pool="a/gpu", pods=(
            PodRef("fn", "a", "Running", pool_pod=True),))),
        (0.0, NodeForgotten(node="n1")),
    )
    counted = Utilization()
    counted.apply_all(events)
    counted.advance(T0.timestamp() + 1)
    assert counted.totals == {Key(NO_POOL, "none", BUSY): 1.0}
    assert node_busy(fold(events).nodes["n1"])


# ------------------------------------------------------------------ properties

_pods = st.lists(st.builds(PodRef, namespace=st.just("fn"), name=st.sampled_from(["a", "b"]),
                           phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
                           pool_pod=st.booleans()), max_size=2).map(tuple)
_node = st.sampled_from(NODES)
_tid = st.sampled_from(["t1", "t2"])
_owner = st.sampled_from(["none", "slurm", "kubernetes"])
_payload = st.one_of(
    st.builds(SlurmNodeObserved, node=_node,
              state=st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "COMPLETING", "DOWN"]),
              flags=st.sampled_from([(), ("DRAIN",), ("COMPLETING",)]),
              alloc_cpus=st.sampled_from([0, 0, 4])),
    st.builds(SlurmNodeVanished, node=_node),
    st.builds(K8sNodeObserved, node=st.sampled_from(K8S), slurm_node=_node),
    st.builds(K8sNodeVanished, node=st.sampled_from(K8S)),
    st.builds(K8sWorkloadObserved, node=st.sampled_from(K8S), pool=st.sampled_from(POOLS),
              pods=_pods),
    st.builds(TransitionStarted, transition_id=_tid, node=_node,
              pool=st.sampled_from([*POOLS, ""]), from_owner=_owner, to_owner=_owner),
    st.builds(TransitionCompleted, transition_id=_tid, node=_node),
    st.builds(TransitionAborted, transition_id=_tid, node=_node),
    st.builds(NodeForgotten, node=_node),
)
_log = st.lists(st.tuples(st.integers(0, 600), _payload), min_size=1, max_size=40)


def _events(steps: list[tuple[int, Payload]]) -> list[RecordedEvent]:
    # Every node starts observed (so transitions and pods land on counted nodes).
    at, items = 0, [(0.0, SlurmNodeObserved(node=node, state="IDLE")) for node in NODES]
    for gap, payload in steps:
        at += gap
        items.append((float(at), payload))
    return log(*items)


def _reference(events: list[RecordedEvent], start: float, end: float
               ) -> tuple[dict[Key, float], dict[str, float]]:
    """Seconds per key and per node by folding every prefix with the real fold."""
    totals: dict[Key, float] = {}
    per_node: dict[str, float] = {}
    pools: dict[str, str] = {}
    state = EMPTY
    for index, event in enumerate(events):
        state = fold([event], state)
        payload = event.payload
        if isinstance(payload, TransitionStarted) and payload.pool:
            pools[payload.node] = payload.pool
        if isinstance(payload, NodeForgotten):
            pools.pop(payload.node, None)
        begin = event.recorded_at.timestamp()
        stop = events[index + 1].recorded_at.timestamp() if index + 1 < len(events) else end
        begin, stop = max(begin, start), min(stop, end)
        if stop <= begin:
            continue
        for name, node in state.nodes.items():
            if not node_counted(node):
                continue
            key = Key(pools.get(name, NO_POOL), node.owner, BUSY if node_busy(node) else IDLE)
            totals[key] = totals.get(key, 0.0) + stop - begin
            per_node[name] = per_node.get(name, 0.0) + stop - begin
    return totals, per_node


def _close(left: dict[Key, float] | dict[str, float],
           right: dict[Key, float] | dict[str, float]) -> bool:
    keys = set(left) | set(right)
    return all(abs(left.get(k, 0.0) - right.get(k, 0.0)) < 1e-6 for k in keys)  # type: ignore[call-overload]


@settings(max_examples=300, deadline=None)
@given(steps=_log, tail=st.integers(0, 600), window=st.tuples(st.integers(-100, 9000),
                                                               st.integers(0, 9000)))
def test_the_fold_agrees_with_the_real_fold(steps: list[tuple[int, Payload]], tail: int,
                                            window: tuple[int, int]) -> None:
    events = _events(steps)
    end = events[-1].recorded_at.timestamp() + tail
    whole = Utilization()
    whole.apply_all(events)
    whole.advance(end)
    expected, per_node = _reference(events, float("-inf"), end)
    assert _close(whole.totals, expected)
    # A node's busy + idle seconds are the time it was observed; owners add up.
    assert _close(whole.node_totals, per_node)
    assert abs(sum(whole.totals.values()) - sum(whole.node_totals.values())) < 1e-6
    assert abs(sum(r.busy_s + r.idle_s for r in whole.rows())
               - sum(whole.totals.values())) < 1e-6

    start = T0.timestamp() + window[0]
    stop = start + window[1]
    period = Utilization(start, stop)
    period.apply_all(events)
    period.advance(end)
    clipped, _ = _reference(events, start, min(stop, end))
    assert _close(period.totals, clipped)


@settings(max_examples=150, deadline=None)
@given(steps=_log, cut=st.integers(0, 40), tail=st.integers(0, 600))
def test_seeding_from_a_folded_state_counts_the_rest(
        steps: list[tuple[int, Payload]], cut: int, tail: int) -> None:
    """A daemon starting from a snapshot: `from_state(fold(prefix))` then the tail gives
    the reference's seconds after the cut (pools as the prefix's transitions say)."""
    events = _events(steps)
    cut = min(cut, len(events))
    prefix, rest = events[:cut], events[cut:]
    at = prefix[-1].recorded_at.timestamp() if prefix else T0.timestamp()
    pools: dict[str, str] = {}
    for event in prefix:
        if isinstance(event.payload, TransitionStarted) and event.payload.pool:
            pools[event.payload.node] = event.payload.pool
        if isinstance(event.payload, NodeForgotten):
            pools.pop(event.payload.node, None)
    seeded = Utilization.from_state(fold(prefix), at, pools)
    seeded.apply_all(rest)
    end = events[-1].recorded_at.timestamp() + tail
    seeded.advance(end)
    expected, _ = _reference(events, at, end)
    assert _close(seeded.totals, expected)


@settings(max_examples=150, deadline=None)
@given(steps=_log, tail=st.integers(0, 600), hours=st.integers(0, 3),
       width=st.sampled_from([60.0, 600.0, 3600.0]))
def test_buckets_give_exact_windows_from_a_boundary(
        steps: list[tuple[int, Payload]], tail: int, hours: int, width: float) -> None:
    """`since(boundary)` of a bucketed fold equals a fold clipped to start there, before
    and after pruning older buckets."""
    events = _events(steps)
    end = events[-1].recorded_at.timestamp() + tail
    bucketed = Utilization(bucket_seconds=width)
    bucketed.apply_all(events)
    bucketed.advance(end)
    boundary = (T0.timestamp() // width + hours * 3600 // width) * width
    clipped = Utilization(boundary)
    clipped.apply_all(events)
    clipped.advance(end)
    assert _close({(r.pool, r.owner, "b"): r.busy_s for r in bucketed.since(boundary)}  # type: ignore[arg-type]
                  | {(r.pool, r.owner, "i"): r.idle_s for r in bucketed.since(boundary)},
                  {(r.pool, r.owner, "b"): r.busy_s for r in clipped.rows()}
                  | {(r.pool, r.owner, "i"): r.idle_s for r in clipped.rows()})
    before = bucketed.since(boundary)
    bucketed.prune(boundary)
    assert bucketed.since(boundary) == before
    assert all(index * width >= boundary for index, _key in bucketed.buckets)
    assert abs(sum(bucketed.buckets.values()) - sum(r.busy_s + r.idle_s for r in before)) < 1e-6
