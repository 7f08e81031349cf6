"""The demand forecast's summary (domain/forecast.py) and its fold (state.demand_history)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain import forecast
from sunkd.domain.events import K8sDemandObserved, K8sWorkloadObserved, PendingPod, PodRef
from sunkd.domain.forecast import BUCKETS, HOUR, DemandSummary, predict
from sunkd.domain.snapshot import state_from_json, state_to_json
from tests.unit.domain_world import POOL
from tests.unit.test_domain_policy import _cluster

DAY = 24 * HOUR


def _daily(hour: float) -> int:
    """A diurnal demand: 10 nodes at night, 40 at 14:00."""
    return 10 if not 10 <= hour % 24 <= 18 else 40


def _feed(summary: DemandSummary, start: float, hours: int,
          demand: Callable[[int], int]) -> DemandSummary:
    for h in range(hours):
        at = start + h * HOUR
        summary = forecast.observe(summary, at + 60, busy=demand(h), pending=0)
    return summary


readings = st.lists(st.tuples(st.floats(0, 30 * DAY), st.integers(0, 500),
                              st.integers(0, 500)), max_size=80)


@settings(max_examples=80, deadline=None)
@given(readings=readings, quantile=st.floats(0.5, 0.99))
def test_the_summary_is_bounded_deterministic_and_never_predicts_cold(
    readings: list[tuple[float, int, int]], quantile: float
) -> None:
    summary = DemandSummary()
    again = DemandSummary()
    for at, busy, pending in sorted(readings):
        summary = forecast.observe(summary, at, busy=busy, pending=pending)
        again = forecast.observe(again, at, busy=busy, pending=pending)
    assert summary == again
    assert len(summary.means) == len(summary.variances) == len(summary.samples) == BUCKETS
    assert forecast.from_json(json.loads(json.dumps(forecast.to_json(summary)))) == summary
    for hour in range(BUCKETS):
        found = predict(summary, hour * HOUR, quantile)
        if (summary.samples[hour] < forecast.MIN_SAMPLES
                or summary.errors[hour] > forecast.ERROR_LIMIT):
            assert found is None
        else:
            assert found is not None and found.wanted >= 0
            assert found.wanted <= max(b + p for _, b, p in readings) * 3 + 1


def test_a_daily_profile_is_learned_with_a_small_error() -> None:
    summary = _feed(DemandSummary(), 0.0, 7 * 24, _daily)
    assert predict(DemandSummary(), 14 * HOUR, 0.9) is None  # cold start: nothing
    peak = predict(summary, 8 * DAY + 14 * HOUR, 0.9)
    night = predict(summary, 8 * DAY + 3 * HOUR, 0.9)
    assert peak is not None and night is not None
    assert peak.wanted == 40 and night.wanted == 10
    assert summary.error < 0.05 < forecast.ERROR_LIMIT


def test_random_demand_is_learned_with_a_large_error() -> None:
    rng = random.Random(1)
    summary = _feed(DemandSummary(), 0.0, 7 * 24, lambda _h: rng.choice([1, 5, 40, 80]))
    assert summary.error > forecast.ERROR_LIMIT


def test_the_fold_keeps_the_pool_s_summary_and_a_snapshot_keeps_it() -> None:
    log = _cluster(3, kubernetes=("n2", "n3"))
    base = 1_000_000.0
    for day in range(3):
        at = base + day * DAY
        log.add(K8sWorkloadObserved(node="n2", pool=POOL, pods=(
            PodRef("serving", "a", "Running"),)), at)
        log.add(K8sDemandObserved(pool=POOL, pending=tuple(
            PendingPod("serving", f"p{i}", gpus=8) for i in range(2))), at + 1)
        log.add(K8sDemandObserved(pool=POOL, pending=()), at + 2 * HOUR)
        log.add(K8sWorkloadObserved(node="n2", pool=POOL, pods=()), at + 3 * HOUR)
    state = log.state()
    summary = state.demand_history[POOL]
    assert summary.busy == 0 and summary.pending == 0
    hour = int((base + 1) // HOUR) % BUCKETS
    assert summary.samples[hour] == 3 and summary.means[hour] == 3.0  # 1 busy + 2 pending
    raw = state_to_json(state)
    assert state_from_json(json.loads(json.dumps(raw))) == state
    raw.pop("demand_history")  # a snapshot written before the forecast: starts cold
    assert state_from_json(raw).demand_history == {}


def test_a_garbled_history_predicts_nothing() -> None:
    """A snapshot's summary with NaN or infinite numbers (Python's JSON reads both) starts
    those fields cold, and an hour whose error is not a number predicts nothing: never a
    lend ahead on garbage, and never a forecast loop that cannot end."""
    nan, inf = float("nan"), float("inf")
    ready = (forecast.MIN_SAMPLES,) * BUCKETS
    garbled = DemandSummary(means=(3.0,) * BUCKETS, samples=ready, errors=(nan,) * BUCKETS)
    assert predict(garbled, 0.0, 0.9) is None
    raw = json.loads(json.dumps(forecast.to_json(DemandSummary(
        means=(inf,) * BUCKETS, samples=ready, lead=nan))))
    loaded = forecast.from_json(raw)
    assert loaded.lead == 0.0 and loaded.means == (0.0,) * BUCKETS
    assert predict(loaded, 0.0, 0.9) is not None  # cold means, real samples: a number


def test_the_error_counts_from_the_first_miss() -> None:
    """An hour whose second day doubles its first is missed by 100 %: its error is that
    miss, not a third of it averaged with the zero it started from (cold hours do not
    dilute the error, so a pool that misses is not lent ahead for on its second day)."""
    summary = DemandSummary()
    for day, demand in enumerate((10, 20)):
        summary = forecast.observe(summary, day * DAY + 14 * HOUR + 60, busy=demand, pending=0)
        summary = forecast.observe(summary, day * DAY + 15 * HOUR + 60, busy=0, pending=0)
    summary = forecast.close_hours(summary, 2 * DAY)
    assert summary.samples[14] == 2
    assert summary.errors[14] == 1.0
    assert predict(summary, 2 * DAY + 14 * HOUR, 0.9) is None
    # Then it decays as before: a third day that hits brings it down by ALPHA's share.
    summary = forecast.observe(summary, 2 * DAY + 14 * HOUR + 60, busy=round(summary.means[14]),
                               pending=0)
    summary = forecast.close_hours(summary, 2 * DAY + 15 * HOUR)
    assert summary.errors[14] < 1.0
