"""Lease leader election (client-go semantics) over HTTP, on both backends (the API
emulator and the real kube-apiserver; tests/integration/kube_backends.py).

Expiry is judged on each candidate's local monotonic clock, so the tests drive a fake clock
instead of sleeping through lease durations."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sunkd.kubernetes.client import LEASES, KubeClient
from sunkd.kubernetes.lease import LeaseElector

from .kube_backends import Kube
from .kube_helpers import ensure_namespace

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def leases(kube: Kube) -> AsyncIterator[Kube]:
    await ensure_namespace(kube.client, "sunkd")
    yield kube


def candidate(client: KubeClient, identity: str, clock: FakeClock) -> LeaseElector:
    return LeaseElector(client, namespace="sunkd", name="sunkd-leader", identity=identity,
                        lease_duration=15, renew_deadline=10, retry_period=2, clock=clock)


async def test_two_candidates_one_leader(leases: Kube) -> None:
    client = leases.client
    clock = FakeClock()
    a, b = candidate(client, "a", clock), candidate(client, "b", clock)
    results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(results) == [False, True]
    leader, follower = (a, b) if results[0] else (b, a)
    assert await follower.try_acquire_or_renew() is False
    assert await leader.try_acquire_or_renew() is True  # renew
    lease = await client.get(LEASES, "sunkd-leader", "sunkd")
    spec = lease["spec"]
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert MICRO_TIME.match(spec["renewTime"]) and MICRO_TIME.match(spec["acquireTime"])
    assert leader.holds_lease() and not follower.holds_lease()
    assert follower.observed_holder == leader.identity


async def test_takeover_after_expiry_increments_transitions(
    leases: Kube,
) -> None:
    client = leases.client
    clock = FakeClock()
    a, b = candidate(client, "a", clock), candidate(client, "b", clock)
    assert await a.acquire()
    assert await b.try_acquire_or_renew() is False  # b starts observing the record now
    clock.now += 14  # a is silent (paused); the lease is still valid by b's clock
    assert await b.try_acquire_or_renew() is False
    assert not a.holds_lease()  # a's own fencing check: renewed too long ago
    clock.now += 2  # 16 s since b saw the record change: expired
    assert await b.try_acquire_or_renew() is True
    spec = (await client.get(LEASES, "sunkd-leader", "sunkd"))["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # The paused old leader wakes up: its own clock says its lease ran out, so it re-reads the
    # Lease, sees b's valid record, and does not act as leader.
    assert await a.try_acquire_or_renew() is False
    assert a.observed_holder == "b" and not a.is_leader()


async def test_renewals_keep_followers_out(leases: Kube) -> None:
    client = leases.client
    clock = FakeClock()
    a, b = candidate(client, "a", clock), candidate(client, "b", clock)
    assert await a.acquire()
    for _ in range(10):
        clock.now += 5
        assert await a.try_acquire_or_renew() is True
        assert await b.try_acquire_or_renew() is False
    spec = (await client.get(LEASES, "sunkd-leader", "sunkd"))["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0


async def test_release_hands_over_at_once(leases: Kube) -> None:
    client = leases.client
    clock = FakeClock()
    a, b = candidate(client, "a", clock), candidate(client, "b", clock)
    assert await a.acquire()
    assert await b.try_acquire_or_renew() is False
    assert await a.release() is True
    assert await b.try_acquire_or_renew() is True  # no waiting for expiry
    spec = (await client.get(LEASES, "sunkd-leader", "sunkd"))["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


async def test_run_loop_leads_then_releases(leases: Kube) -> None:
    client = leases.client
    elector = LeaseElector(client, namespace="sunkd", name="run-lease", identity="solo",
                           lease_duration=3, renew_deadline=2, retry_period=1)
    started, stopped = asyncio.Event(), asyncio.Event()

    async def on_started() -> None:
        started.set()
        await asyncio.Event().wait()

    async def on_stopped() -> None:
        stopped.set()

    stop = asyncio.Event()
    task = asyncio.create_task(elector.run(on_started, on_stopped, stop))
    await asyncio.wait_for(started.wait(), 5)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert stopped.is_set()
    spec = (await client.get(LEASES, "run-lease", "sunkd"))["spec"]
    assert spec["holderIdentity"] in ("", None)  # released


@pytest.mark.emulator_only("500s on the next requests")
async def test_server_errors_do_not_crown_anyone(leases: Kube) -> None:
    emulator, client = leases.faults, leases.client
    clock = FakeClock()
    a = candidate(client, "a", clock)
    emulator.fail_next(3, 500)
    results = [await a.try_acquire_or_renew() for _ in range(3)]
    assert results == [False, False, False]
    assert await a.try_acquire_or_renew() is True


def test_parameters_validated() -> None:
    with pytest.raises(ValueError):
        LeaseElector(None, namespace="x", name="y", identity="z",  # type: ignore[arg-type]
                     lease_duration=5, renew_deadline=6, retry_period=1)


async def test_two_running_candidates_hand_over_on_stop(leases: Kube) -> None:
    """Real clocks: two `run()` loops; never two leaders at once; stopping the leader releases
    the lease and the other takes over without waiting for expiry."""
    client = leases.client
    leading: set[str] = set()
    overlaps = 0
    started = {"a": asyncio.Event(), "b": asyncio.Event()}
    stops = {"a": asyncio.Event(), "b": asyncio.Event()}

    def callbacks(name: str) -> tuple[Any, Any]:
        async def on_started() -> None:
            nonlocal overlaps
            leading.add(name)
            overlaps += len(leading) > 1
            started[name].set()
            await asyncio.Event().wait()

        async def on_stopped() -> None:
            leading.discard(name)

        return on_started, on_stopped

    electors = {
        name: LeaseElector(client, namespace="sunkd", name="pair", identity=name,
                           lease_duration=3, renew_deadline=2, retry_period=1)
        for name in ("a", "b")
    }
    tasks = {name: asyncio.create_task(electors[name].run(*callbacks(name), stops[name]))
             for name in electors}
    try:
        waiters = [asyncio.create_task(e.wait()) for e in started.values()]
        done, pending = await asyncio.wait(waiters, timeout=5,
                                           return_when=asyncio.FIRST_COMPLETED)
        for waiter in pending:
            waiter.cancel()
        assert done
        first = next(iter(leading))
        second = "b" if first == "a" else "a"
        await asyncio.sleep(1.5)  # a renewal round: still one leader
        assert leading == {first}
        loop = asyncio.get_running_loop()
        handover_started = loop.time()
        stops[first].set()
        await asyncio.wait_for(tasks[first], 5)
        await asyncio.wait_for(started[second].wait(), 5)
        # Released (empty holder) means no 3 s expiry wait: only a retry period or so.
        assert loop.time() - handover_started < 2.6
        spec = (await client.get(LEASES, "pair", "sunkd"))["spec"]
        assert spec["holderIdentity"] == second and spec["leaseTransitions"] == 1
        assert overlaps == 0
    finally:
        for name in stops:
            stops[name].set()
        await asyncio.wait_for(asyncio.gather(*tasks.values()), 10)
