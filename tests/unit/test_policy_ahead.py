"""Headroom ahead of the forecast peak (policy/ahead.py), on a six-node pool.

Kubernetes holds n5, n6 with pods on both; for `days` days its pods wanted two more
nodes from 13:00 to 15:00 UTC (two pods pending). On the next day, a Slurm backlog
waits and nothing is pending: only the forecast can lend.
"""

from __future__ import annotations

from dataclasses import replace

from sunkd.domain.events import K8sDemandObserved, K8sWorkloadObserved, PendingPod, PodRef
from sunkd.domain.forecast import HOUR
from sunkd.domain.policy import RequestAction, StartTransition, decide, forecast_wanted
from sunkd.domain.policy import ahead as ahead_policy
from tests.unit.domain_world import POOL, Log, pool_spec, slurm_obs
from tests.unit.test_domain_policy import _cluster
from tests.unit.test_policy_fairness import _queue

DAY = 24 * HOUR
T0 = 100 * DAY  # midnight UTC


def _history(days: int, peak_pods: int = 2, noisy: bool = False,
             kubernetes: tuple[str, ...] = ("n5", "n6")) -> Log:
    log = _cluster(6, kubernetes=kubernetes)
    for name in ("n5", "n6"):
        log.add(K8sWorkloadObserved(node=name, pool=POOL, pods=(
            PodRef("serving", f"{name}-a", "Running"),)), T0)
    for day in range(days):
        start = T0 + day * DAY
        pods = peak_pods if not noisy else (0, 6, 1, 4, 0, 5)[day % 6]
        log.add(K8sDemandObserved(pool=POOL, pending=tuple(
            PendingPod("serving", f"d{day}-{i}") for i in range(pods))), start + 13 * HOUR)
        log.add(K8sDemandObserved(pool=POOL, pending=()), start + 15 * HOUR)
    _queue(log, 40, head=1, now=T0 + days * DAY)  # the backlog: Slurm wants every node
    return log


def _lends(log: Log, now: float, **knobs: object) -> list[StartTransition]:
    spec = pool_spec(prefer="Slurm", forecast=True, **knobs)
    return [d for d in decide(log.state(), [spec], now)
            if isinstance(d, StartTransition) and d.to_owner == "kubernetes"]


def test_the_forecast_lends_ahead_of_the_daily_peak_with_its_reason() -> None:
    log = _history(3)
    day = T0 + 3 * DAY
    assert _lends(log, day + 12 * HOUR + 1800) == []  # 12:30: the hour wants 2, held 2
    lends = _lends(log, day + 13 * HOUR + 10)
    # Fair share 3 of 6 under prefer: Slurm: one more node, not the two the peak wants.
    assert [d.node for d in lends] == ["n1"]
    assert lends[0].reason.startswith(
        "lent ahead of the forecast peak at 13:00 UTC: 4 node(s) wanted, 2 held")


def test_a_forecast_lend_only_starts_a_drain() -> None:
    log = _history(3)
    decisions = decide(log.state(), [pool_spec(forecast=True)], T0 + 3 * DAY + 13 * HOUR + 10)
    actions = [(d.node, d.verb) for d in decisions if isinstance(d, RequestAction)]
    assert actions == [("n1", "drain")]  # the unlock waits for Slurm to report drained


def test_the_lead_time_moves_the_lend_earlier() -> None:
    log = _history(3)
    state = log.state()
    summary = state.demand_history[POOL]
    warm = replace(state, demand_history={POOL: replace(summary, lead=2 * HOUR,
                                                          leads_seen=3)})
    spec = pool_spec(forecast=True)
    at = T0 + 3 * DAY + 11 * HOUR + 10  # two hours before the peak
    assert [d.node for d in decide(warm, [spec], at) if isinstance(d, StartTransition)] == ["n1"]
    assert [d for d in decide(state, [spec], at) if isinstance(d, StartTransition)] == []


def test_no_forecast_lend_when_off_cold_noisy_or_capped() -> None:
    peak = 3 * DAY + 13 * HOUR + 1
    assert _lends(_history(1), T0 + DAY + 13 * HOUR + 1) == []  # one day: cold start
    log = _history(3)
    spec = pool_spec(prefer="Slurm")  # forecast off: today's behaviour
    assert [d for d in decide(log.state(), [spec], T0 + peak)
            if isinstance(d, StartTransition) and d.to_owner == "kubernetes"] == []
    assert _lends(log, T0 + peak, max_kubernetes=2) == []
    noisy = _history(6, noisy=True)
    assert noisy.state().demand_history[POOL].errors[13] > 0.3  # the peak hour misses
    assert _lends(noisy, T0 + 6 * DAY + 13 * HOUR + 1) == []


def test_the_forecast_keeps_what_its_peak_wants_from_slurm_s_backlog() -> None:
    log = _history(3)
    # At the peak Slurm's backlog does not take back n5 or n6 (pods run there):
    # prefer: Slurm would, as without the forecast.
    at = T0 + 3 * DAY + 13 * HOUR + 1
    off = [d for d in decide(log.state(), [pool_spec()], at)
           if isinstance(d, StartTransition) and d.to_owner == "slurm"]
    assert off != []
    on = [d for d in decide(log.state(), [pool_spec(forecast=True)], at)
          if isinstance(d, StartTransition) and d.to_owner == "slurm"]
    assert on == []


def test_a_flat_forecast_lends_nothing_ahead() -> None:
    """Three days of the same two busy nodes all day (no peak): the forecast is warm and
    predicts every hour, and at no hour of the fourth day does it lend ahead (a rise it
    does not see is no reason to drain a node), nor keep anything from Slurm beyond
    what Kubernetes holds."""
    log = _history(3, peak_pods=0)
    state = log.state()
    spec = pool_spec(prefer="Slurm", forecast=True)
    day = T0 + 3 * DAY
    for hour in range(24):
        now = day + hour * HOUR + 30
        found = forecast_wanted(state, spec, now)
        assert found is not None and found[0].wanted == 2, hour
        assert _lends(log, now) == [], hour


def _busy(log: Log, ends: dict[str, float]) -> None:
    for name, end in ends.items():
        log.add(replace(slurm_obs(name, "ALLOCATED", alloc_cpus=8), jobs=1, job_end=end),
                T0 + 3 * DAY)


def test_the_forecast_skips_a_node_whose_drain_ends_after_the_peak() -> None:
    """A lend ahead drains a node so that it is Kubernetes' when the peak comes: a node
    whose job runs past the peak's hour (or the horizon) would be drained for nothing
    there and cost the job's node the whole time. Those are skipped; a node whose job
    ends within the peak's hour is lent."""
    day = T0 + 3 * DAY
    now = day + 13 * HOUR + 30
    late = day + 18 * HOUR  # past the 13:00 peak's hour and the 4 h horizon
    log = _history(3)
    _busy(log, {name: late for name in ("n1", "n2", "n3", "n4")})
    assert _lends(log, now) == []
    log = _history(3)
    _busy(log, {"n1": late, "n2": late, "n3": day + 13 * HOUR + 1200, "n4": late})
    lends = _lends(log, now)
    assert [d.node for d in lends] == ["n3"]
    assert lends[0].reason.startswith("lent ahead of the forecast peak at 13:00 UTC")


def test_a_fresh_forecast_settles_before_it_lends() -> None:
    """The window's hour edge (13:00 here) refreshes the forecast, while the new hour's
    first readings are still coming: nothing is lent ahead in its first
    FORECAST_SETTLE_SECONDS, then the lend starts (a reactive lend is not delayed)."""
    settle = getattr(ahead_policy, "FORECAST_SETTLE_SECONDS", 0.0)
    log = _history(3)
    edge = T0 + 3 * DAY + 13 * HOUR
    assert settle == 5.0
    assert _lends(log, edge) == []
    assert _lends(log, edge + settle - 1) == []
    assert [d.node for d in _lends(log, edge + settle)] == ["n1"]
    state = log.state()
    summary = state.demand_history[POOL]
    warm = replace(state, demand_history={POOL: replace(summary, lead=2 * HOUR,
                                                          leads_seen=3)})
    spec = pool_spec(forecast=True)
    early = edge - 2 * HOUR  # the lead's end crosses 13:00: that edge settles too
    assert [d for d in decide(warm, [spec], early + 1) if isinstance(d, StartTransition)] == []
    assert [d.node for d in decide(warm, [spec], early + settle)
            if isinstance(d, StartTransition)] == ["n1"]


def test_nodes_lent_for_a_peak_that_recurs_within_the_horizon_are_kept() -> None:
    """The recent-peak hold: after the 13:00-15:00 peak Kubernetes holds four nodes, two
    of them idle, and Slurm's backlog waits. With the forecast on, a peak that comes back
    within `forecast_horizon_seconds` keeps them (giving them back now means lending them
    again before tomorrow's peak: two moves each for a few hours of batch work); with a
    horizon that does not reach it they go back, as with the forecast off."""
    log = _history(3, kubernetes=("n3", "n4", "n5", "n6"))
    day = T0 + 3 * DAY  # the fourth day's peak came too, and went
    log.add(K8sDemandObserved(pool=POOL, pending=(
        PendingPod("serving", "d3-0"), PendingPod("serving", "d3-1"))), day + 13 * HOUR)
    log.add(K8sDemandObserved(pool=POOL, pending=()), day + 15 * HOUR)
    now = day + 17 * HOUR + 30

    def reclaims(**knobs: object) -> list[str]:
        spec = pool_spec(prefer="Slurm", **knobs)
        return [d.node for d in decide(log.state(), [spec], now)
                if isinstance(d, StartTransition) and d.to_owner == "slurm"]

    assert reclaims()[:1] == ["n3"]  # forecast off: an idle one goes back
    assert reclaims(forecast=True)[:1] == ["n3"]  # 4 h: tomorrow's peak is beyond
    assert reclaims(forecast=True, forecast_horizon_seconds=24 * HOUR) == []


def test_a_horizon_beyond_the_longest_window_reads_that_window() -> None:
    """A Nodeset's horizon is not bounded (the config file's is, to 30 days): a longer
    one, infinity included, reads the longest window and ends; a NaN reads nothing."""
    log = _history(3)
    day = T0 + 3 * DAY  # the fourth day's peak came too, and went
    log.add(K8sDemandObserved(pool=POOL, pending=(
        PendingPod("serving", "d3-0"), PendingPod("serving", "d3-1"))), day + 13 * HOUR)
    log.add(K8sDemandObserved(pool=POOL, pending=()), day + 15 * HOUR)
    state = log.state()
    now = day + 17 * HOUR + 30
    for horizon in (31 * DAY, float("inf")):
        found = forecast_wanted(state, pool_spec(forecast=True,
                                                 forecast_horizon_seconds=horizon),
                                now, horizon=True)
        assert found is not None and found[0].wanted == 4, horizon
    assert forecast_wanted(state, pool_spec(forecast=True,
                                            forecast_horizon_seconds=float("nan")),
                           now, horizon=True) is None
