"""Daily blocks behind the forecast (policy/blocks.py).

The planner on hand-made profiles, then the policy on a six-node pool whose profile says
Kubernetes wants 3 nodes by day (08:00-20:00 UTC) and 1 by night, under a Slurm backlog;
then a property: no profile, however adversarial, makes a block break `max_kubernetes`,
a pin, a hold, or hand over a node Slurm does not report drained.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from sunkd.domain import forecast
from sunkd.domain.events import K8sWorkloadObserved, OperatorPinned, PodRef, TransitionStarted
from sunkd.domain.forecast import BUCKETS, HOUR, DemandSummary
from sunkd.domain.policy import AbortTransition, CompleteTransition, StartTransition, decide
from sunkd.domain.policy.blocks import DAY, RETURN, TROUGH, Block, block_now, plan_block
from sunkd.domain.state import ClusterState
from tests.unit.domain_world import POOL, k8s_obs, pool_spec, slurm_obs, sunkd_drained
from tests.unit.test_domain_policy import LEND_DRAIN, _cluster
from tests.unit.test_domain_properties import _check_round
from tests.unit.test_policy_fairness import _queue

T0 = 100 * 24 * HOUR  # midnight UTC


def _summary(day: int = 3, night: int = 1, *, samples: int = 5, error: float = 0.05,
             lead: float = 0.0) -> DemandSummary:
    means = tuple(float(day if 8 <= h < 20 else night) for h in range(BUCKETS))
    return DemandSummary(means=means, variances=(0.0,) * BUCKETS, samples=(samples,) * BUCKETS,
                         errors=(error,) * BUCKETS, lead=lead, leads_seen=3 if lead else 0,
                         hour=-1)  # no hour closes: the profile stays as given


def test_the_block_is_the_trough_below_the_day_s_level() -> None:
    block = plan_block(_summary(50, 20), 0.9, 8)
    assert block is not None and math.isclose(block.error, 0.05)
    assert replace(block, error=0.05) == Block(start=20, hours=12, keep=20, level=50, error=0.05)
    assert block.nodes == 30 and block.label() == "20:00-08:00"
    # A minimum longer than the trough plans a window that includes day hours only if
    # it still pays; here the trough alone is 12 h, so 13 h keeps a day hour's 50.
    assert plan_block(_summary(50, 20), 0.9, 13) is None


def test_no_block_when_flat_cold_unpredictable_or_off() -> None:
    assert plan_block(_summary(40, 40), 0.9, 4) is None  # flat: no node to lend
    assert plan_block(_summary(samples=1), 0.9, 4) is None  # an hour seen once: cold
    assert plan_block(_summary(error=0.5), 0.9, 4) is None  # the window misses too much
    assert plan_block(_summary(error=math.nan), 0.9, 4) is None
    for hours in (0.0, -1.0, math.nan):
        assert plan_block(_summary(), 0.9, hours) is None
    spec = pool_spec(forecast=False, forecast_block_hours=8)
    assert block_now(_summary(), spec.ownership, T0) is None  # blocks need the forecast on


def test_the_phases_of_a_day() -> None:
    spec = pool_spec(forecast=True, forecast_block_hours=8, max_in_flight=1)
    summary = _summary(lead=1800)  # two nodes back, one at a time: from 07:00
    at = {h: block_now(summary, spec.ownership, T0 + h * HOUR + 60) for h in (3, 7, 12, 21)}
    assert {h: b.phase for h, b in at.items() if b} == {3: TROUGH, 7: RETURN, 12: DAY,
                                                       21: TROUGH}
    assert at[3] is not None and at[3].returns_at == T0 + 7 * HOUR
    assert at[12] is not None and at[12].began == T0 + 20 * HOUR  # the next window


def _pool(kubernetes: tuple[str, ...], pods_on: tuple[str, ...],
          summary: DemandSummary) -> ClusterState:
    log = _cluster(6, kubernetes=kubernetes)
    for name in pods_on:
        log.add(K8sWorkloadObserved(node=name, pool=POOL, pods=(
            PodRef("serving", f"{name}-a", "Running"),)), T0)
    _queue(log, 40, head=1, now=T0)  # the backlog: Slurm wants every node
    state = log.state()
    return replace(state, demand_history={POOL: summary})


def _starts(state: ClusterState, now: float, **knobs: object) -> list[StartTransition]:
    spec = pool_spec(prefer="Slurm", forecast=True, **knobs)
    return [d for d in decide(state, [spec], now) if isinstance(d, StartTransition)]


def test_the_trough_goes_to_slurm_with_the_block_s_reason_and_the_day_keeps_its_level() -> None:
    state = _pool(("n4", "n5", "n6"), ("n5", "n6"), _summary())
    night = T0 + 24 * HOUR + 2 * HOUR
    starts = _starts(state, night, forecast_block_hours=8)
    assert [(d.node, d.to_owner) for d in starts] == [("n4", "slurm")]
    assert starts[0].reason == ("block: 2 node(s) to Slurm for the trough 20:00-08:00 UTC "
                                "(Kubernetes forecast to want at most 1, 3 by day)")
    # The block never evicts: n5 and n6 run pods, they stay (one would be surplus).
    wide = _starts(state, night, forecast_block_hours=8, max_in_flight=3)
    assert [(d.node, d.to_owner) for d in wide] == [("n4", "slurm")]
    noon = T0 + 24 * HOUR + 12 * HOUR
    assert _starts(state, noon, forecast_block_hours=8) == []  # the day keeps 3
    # Without blocks the backlog takes the idle node at noon too.
    assert [d.node for d in _starts(replace(state, demand_history={}), noon)] == ["n4"]


def test_the_block_goes_back_ahead_of_the_rise() -> None:
    state = _pool(("n5", "n6"), ("n5", "n6"), _summary(lead=1800))
    day = T0 + 24 * HOUR
    assert _starts(state, day + 6 * HOUR, forecast_block_hours=8) == []  # still the trough
    starts = _starts(state, day + 7 * HOUR + 10, forecast_block_hours=8)
    assert [(d.node, d.to_owner) for d in starts] == [("n1", "kubernetes")]
    assert starts[0].reason == ("block: 1 node(s) back to Kubernetes ahead of the rise at "
                                "08:00 UTC (trough 20:00-08:00, 3 wanted then, lead 60 min)")


RETURN_WHY = ("block: 1 node(s) back to Kubernetes ahead of the rise at 08:00 UTC "
              "(trough 20:00-08:00, 3 wanted then, lead 60 min)")


def _returning(head: int, reason: str = RETURN_WHY) -> ClusterState:
    """n1 being lent back ahead of the rise (drained by sunkd, its job still runs), and
    Slurm's next job wanting `head` nodes."""
    log = _cluster(6, kubernetes=("n5", "n6"))
    for name in ("n5", "n6"):
        log.add(K8sWorkloadObserved(node=name, pool=POOL, pods=(
            PodRef("serving", f"{name}-a", "Running"),)), T0)
    start = T0 + 24 * HOUR + 7 * HOUR
    log.add(TransitionStarted(transition_id="tx-lend-n1", node="n1", pool=POOL,
                              from_owner="slurm", to_owner="kubernetes", reason=reason), start)
    sunkd_drained(log, "n1", LEND_DRAIN, start)
    log.add(slurm_obs("n1", state="ALLOCATED", flags=("DRAIN",), reason=LEND_DRAIN,
                      alloc_cpus=8), start)
    _queue(log, 40, head=head, now=start)
    return replace(log.state(), demand_history={POOL: _summary(lead=1800)})


def _aborted(state: ClusterState, now: float, **knobs: object) -> list[str]:
    spec = pool_spec(prefer="Slurm", forecast=True, forecast_block_hours=8, **knobs)
    return [d.reason for d in decide(state, [spec], now) if isinstance(d, AbortTransition)]


def test_a_return_lend_in_flight_is_kept_when_slurm_s_next_job_shrinks_the_room() -> None:
    """A four-node job heading Slurm's queue leaves no room for a lend ahead: the
    return's lend used to be aborted as "demand gone" (and started again, or not, a
    minute later); the block's window still says the rise is coming."""
    now = T0 + 24 * HOUR + 7 * HOUR + 60
    assert _aborted(_returning(head=1), now) == []
    assert _aborted(_returning(head=4), now) == []
    # Only the return's own lends: a lend for the day's level, or for pods, is surplus.
    day_why = "block: 1 node(s) to Kubernetes for the day's level of 3 (trough 20:00-08:00 UTC)"
    assert _aborted(_returning(head=4, reason=day_why), now) == [
        "kubernetes demand gone (fewer nodes needed)"]
    # In the trough proper (the lead not yet reached) it is surplus too.
    early = T0 + 24 * HOUR + 6 * HOUR
    assert _aborted(_returning(head=4), early) == [
        "kubernetes demand gone (fewer nodes needed)"]
    # Never beyond max_kubernetes: two owned, a bound of two leaves no room for it.
    assert _aborted(_returning(head=4), now, max_kubernetes=2) == [
        "kubernetes demand gone (fewer nodes needed)"]


def test_the_day_keeps_what_kubernetes_won_and_lends_up_to_its_level() -> None:
    state = _pool(("n5", "n6"), ("n5", "n6"), _summary())
    noon = T0 + 24 * HOUR + 12 * HOUR
    starts = _starts(state, noon, forecast_block_hours=8)
    assert [(d.node, d.to_owner) for d in starts] == [("n1", "kubernetes")]
    assert starts[0].reason == ("block: 1 node(s) to Kubernetes for the day's level of 3 "
                                "(trough 20:00-08:00 UTC)")
    # Four held by day, one above the level: Slurm's backlog takes none of them back
    # until the trough (its next job, one node, has the Slurm nodes it needs).
    four = _pool(("n3", "n4", "n5", "n6"), ("n5", "n6"), _summary())
    assert _starts(four, noon, forecast_block_hours=8) == []
    assert [d.node for d in _starts(four, noon + 9 * HOUR, forecast_block_hours=8)] == ["n3"]


def _or_nan(values: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    return st.one_of(values, st.just(math.nan), st.just(math.inf))


# Wild: any number, NaN or infinity, cold hours. Warm: a plausible daily profile at the
# pool's scale or far beyond it, every hour seen (so that blocks are planned).
wild = st.builds(
    DemandSummary,
    means=st.tuples(*[_or_nan(st.floats(-5, 1e6))] * BUCKETS),
    variances=st.tuples(*[_or_nan(st.floats(0, 1e6))] * BUCKETS),
    samples=st.tuples(*[st.integers(0, 5)] * BUCKETS),
    errors=st.tuples(*[_or_nan(st.floats(0, 1))] * BUCKETS),
    lead=_or_nan(st.floats(0, 1e6)),
    leads_seen=st.integers(0, 3),
)
warm = st.builds(
    DemandSummary,
    means=st.tuples(*[st.one_of(st.floats(0, 8), st.floats(0, 1e4))] * BUCKETS),
    variances=st.tuples(*[st.floats(0, 4)] * BUCKETS),
    samples=st.just((3,) * BUCKETS),
    errors=st.tuples(*[st.floats(0, 0.35)] * BUCKETS),
    lead=st.floats(0, 4 * 3600),
    leads_seen=st.integers(0, 3),
)
profiles = st.one_of(warm, wild)


@settings(max_examples=150, deadline=None)
@given(summary=profiles, hour=st.floats(0, 48), max_k8s=st.one_of(st.none(), st.integers(0, 6)),
       pinned=st.sets(st.sampled_from(["n1", "n2", "n3"])), held=st.sampled_from(["", "n1", "n2"]),
       draining=st.sampled_from(["", "n2", "n3"]), block_hours=st.sampled_from([1.0, 4.0, 12.0]),
       max_in_flight=st.integers(1, 6), prefer=st.sampled_from(["Slurm", "Kubernetes"]),
       lending=st.booleans())
def test_an_adversarial_profile_never_breaks_the_bounds(
    summary: DemandSummary, hour: float, max_k8s: int | None, pinned: set[str], held: str,
    draining: str, block_hours: float, max_in_flight: int, prefer: str, lending: bool,
) -> None:
    log = _cluster(6, kubernetes=("n5", "n6"))
    if lending:  # n4 is being lent: drained by sunkd, but its job still runs
        log.add(TransitionStarted(transition_id="tx-lend-n4", node="n4", pool=POOL,
                                  from_owner="slurm", to_owner="kubernetes"), T0)
        sunkd_drained(log, "n4", LEND_DRAIN, T0)
        log.add(slurm_obs("n4", state="ALLOCATED", flags=("DRAIN",), reason=LEND_DRAIN,
                          alloc_cpus=8), T0)
    for name in sorted(pinned):
        log.add(OperatorPinned(node=name, to="slurm", who="op", why="keep"), T0)
    if held:  # an admin's drain: sunkd did not make it, the node is held
        log.add(slurm_obs(held, flags=("DRAIN",), reason="admin: maintenance"), T0)
    if draining:  # running a job: a drain would have to wait for it
        log.add(slurm_obs(draining, state="ALLOCATED", alloc_cpus=8), T0)
        log.add(k8s_obs(draining), T0)
    _queue(log, 40, head=1, now=T0)
    state = replace(log.state(), demand_history={POOL: summary})
    spec = pool_spec(prefer=prefer, forecast=True, forecast_block_hours=block_hours,
                     max_kubernetes=max_k8s, max_in_flight=max_in_flight)
    now = T0 + hour * HOUR
    decisions = decide(state, [spec], now)
    _check_round(state, now, decisions, spec)
    lends = [d for d in decisions if isinstance(d, StartTransition) and d.to_owner == "kubernetes"]
    assert not {d.node for d in lends} & (pinned | {held}), lends
    if max_k8s is not None:
        assert len(lends) + 2 + lending <= max(max_k8s, 2 + lending), lends
    # n4's job still runs: it is not handed over (checked by `_check_round` too).
    assert not any(isinstance(d, CompleteTransition) and d.node == "n4" for d in decisions)
    assert len([d for d in decisions if isinstance(d, StartTransition)]) <= max_in_flight
    # Planning is deterministic and bounded: the same summary gives the same block.
    closed = forecast.close_hours(summary, now)
    assert plan_block(closed, 0.9, block_hours) == plan_block(closed, 0.9, block_hours)
    block = plan_block(closed, 0.9, block_hours)
    event("block planned" if block is not None else "no block")
    if block is not None:
        assert 0 <= block.keep < block.level and 1 <= block.hours < BUCKETS
    assert block_now(summary, spec.ownership, now) is None or block is not None
