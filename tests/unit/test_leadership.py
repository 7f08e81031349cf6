"""Leadership's answers on a held lease: acting, pausing, the clock, and why a term lapsed.

The oracle below is how the daemon answered before `Leadership` existed (three methods
of the daemon: acting, "clocks too far apart", "renewal late"); the property pins that
the merged `paused()` and `may_act()` answer the same for any remaining time and offset.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.api.metrics import Metrics
from sunkd.runtime.leadership import Leadership, TermEnd
from sunkd.store.eventlog import Lease

LEASE_SECONDS = 30.0
SKEW = 10.0


class NoStore:
    """These answers never touch the database: any call is a failure of the test."""

    async def acquire(self, identity: str, lease_seconds: float = 15.0) -> Lease | None:
        raise AssertionError("acquire")

    async def renew(self, lease: Lease) -> Lease:
        raise AssertionError("renew")

    async def release(self, lease: Lease) -> None:
        raise AssertionError("release")


def _held(remaining: float, offset: float, wall: float = 1_000.0) -> Leadership:
    leadership = Leadership(NoStore(), identity="a", lease_seconds=LEASE_SECONDS,
                            max_clock_skew=SKEW, metrics=Metrics(), wall_clock=lambda: wall)
    leadership.begin(Lease("a", 1, LEASE_SECONDS,
                           time.monotonic() - (LEASE_SECONDS - remaining), offset))
    return leadership


# Away from the thresholds (0 and a third of the lease) by more than a test's run time.
REMAINING = st.floats(-LEASE_SECONDS, LEASE_SECONDS).filter(
    lambda r: abs(r) > 0.5 and abs(r - LEASE_SECONDS / 3) > 0.5)
OFFSET = st.floats(-3 * SKEW, 3 * SKEW).filter(lambda o: abs(abs(o) - SKEW) > 1e-6)


@settings(max_examples=300, deadline=None)
@given(remaining=REMAINING, offset=OFFSET)
def test_acting_and_pausing_answer_as_the_daemon_did(remaining: float, offset: float) -> None:
    leadership = _held(remaining, offset)
    third = LEASE_SECONDS / 3
    acting = remaining > third and abs(offset) <= SKEW
    clock_paused = remaining > third and abs(offset) > SKEW
    renewal_late = 0 < remaining <= third
    assert leadership.may_act() is acting
    assert leadership.paused() is (clock_paused or renewal_late)
    assert not (leadership.may_act() and leadership.paused())


@given(remaining=REMAINING, offset=OFFSET)
def test_a_term_stepping_down_neither_acts_nor_pauses(remaining: float, offset: float) -> None:
    leadership = _held(remaining, offset)
    leadership.step_down()
    assert not leadership.may_act() and not leadership.paused()


def test_the_clock_is_the_database_clock() -> None:
    assert _held(20.0, -4.0, wall=1_000.0).clock() == 996.0


def test_a_lapsed_lease_says_how_much_was_left() -> None:
    end, reason = _held(5.0, 0.0).lapse()
    assert end is TermEnd.LEASE_EXPIRED
    assert reason.startswith("the lease was not renewed in time: 5.0 s of 30 s left")


def test_term_ends_are_the_metric_labels() -> None:
    """`sunkd_leader_terms_ended_total{cause}` keeps the label values it always had."""
    assert {end.value for end in TermEnd} == {
        "shutdown", "lease_expired", "deposed", "kubernetes_lease", "appends_refused",
        "error"}
