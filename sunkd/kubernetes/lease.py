"""Lease-based leader election with client-go semantics (k8s.io/client-go/tools/leaderelection).

Why not `kubernetes_asyncio.leaderelection`: it builds naive local timestamps and appends "Z",
never maintains `leaseTransitions`, has no release, formats MicroTime via `str(datetime)` (which
drops the fraction when microsecond == 0, so the server rejects it) and elects only once.

Semantics reproduced from client-go `tools/leaderelection`:
- Expiry is judged on the *local monotonic* clock only: a candidate remembers when it last saw
  the raw lease record change (`observed_time`) and treats the lease as held by someone else
  while `observed_time + leaseDurationSeconds > now`. Timestamps in the record are never
  compared across machines (clock skew); they matter only because they change.
- Every write is an Update (PUT) carrying the resourceVersion that was read, so two candidates
  racing for an expired lease cannot both win: the loser gets 409.
- Takeover increments `leaseTransitions` and sets acquireTime; renewal keeps both.
- Release writes an empty holder with leaseDurationSeconds=1 so others take over at once.
- `holds_lease()` is the fencing check to call before every side effect: the last successful
  renewal happened less than `renew_deadline` ago by our monotonic clock. This protects against
  an event loop that stalled (GC, SIGSTOP) past the lease while still believing it leads.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from sunkd.kubernetes.client import JSON, LEASES, KubeApiError, KubeClient
from sunkd.kubernetes.wire import format_micro_time, utcnow

log = structlog.get_logger("sunkd.lease")

JITTER_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    holder: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_lease(cls, lease: JSON) -> LeaderRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


class LeaseElector:
    """One candidate for the Lease `namespace/name`."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_new_leader: Callable[[str], None] | None = None,
    ) -> None:
        if not identity:
            raise ValueError("identity must be non-empty and unique (e.g. podname_uuid)")
        if not lease_duration > renew_deadline > JITTER_FACTOR * retry_period:
            raise ValueError(
                "need lease_duration > renew_deadline > 1.2 * retry_period (client-go rule)"
            )
        if min(lease_duration, renew_deadline, retry_period) < 1.0:
            raise ValueError("lease_duration, renew_deadline, retry_period must be >= 1 s")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.on_new_leader = on_new_leader
        self._observed: LeaderRecord | None = None
        self._observed_raw: str | None = None
        self._observed_time = 0.0
        self._lease: JSON | None = None  # last Lease object we read or wrote
        self._last_renew: float | None = None  # monotonic time of our last successful write
        self._reported_leader: str | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def observed_holder(self) -> str:
        return self._observed.holder if self._observed else ""

    @property
    def transitions(self) -> int:
        """leaseTransitions of the record we hold/observed (usable as a fencing epoch)."""
        return self._observed.transitions if self._observed else 0

    def is_leader(self) -> bool:
        return self._observed is not None and self._observed.holder == self.identity

    def holds_lease(self) -> bool:
        """True while our last successful acquire/renew is younger than renew_deadline."""
        return (
            self.is_leader()
            and self._last_renew is not None
            and self.clock() - self._last_renew < self.renew_deadline
        )

    def _valid(self, now: float) -> bool:
        assert self._observed is not None
        return self._observed_time + self._observed.lease_duration_seconds > now

    def _set_observed(self, lease: JSON, record: LeaderRecord, now: float) -> None:
        self._lease = lease
        self._observed = record
        self._observed_raw = json.dumps(record.to_spec(), sort_keys=True)
        self._observed_time = now
        self._maybe_report(record.holder)

    def _maybe_report(self, holder: str) -> None:
        if holder != self._reported_leader:
            self._reported_leader = holder
            log.info("lease holder changed", lease=f"{self.namespace}/{self.name}", holder=holder)
            if self.on_new_leader is not None and holder:
                self.on_new_leader(holder)

    # -- one round ------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """client-go tryAcquireOrRenew: True when we hold the lease after this call."""
        now = self.clock()
        stamp = format_micro_time(utcnow())
        duration = round(self.lease_duration)

        # 1. Leader fast path: renew with the cached object's resourceVersion.
        if self.is_leader() and self._lease is not None and self._valid(now):
            assert self._observed is not None
            record = LeaderRecord(
                self.identity,
                duration,
                self._observed.acquire_time,
                stamp,
                self._observed.transitions,
            )
            written = await self._update(self._lease, record)
            if written is not None:
                self._set_observed(written, record, now)
                self._last_renew = now
                return True

        # 2. Read the current lease (create it when missing).
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except KubeApiError as error:
            if error.status != 404:
                log.warning("lease get failed", error=str(error))
                return False
            record = LeaderRecord(self.identity, duration, stamp, stamp, 0)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": record.to_spec(),
            }
            try:
                created = await self.client.create(LEASES, body, self.namespace)
            except KubeApiError as create_error:
                # 409 AlreadyExists: another candidate created it first.
                log.info("lease create lost", status=create_error.status)
                return False
            except (aiohttp.ClientError, TimeoutError, OSError) as create_error:
                log.warning("lease create failed", error=str(create_error))
                return False
            self._set_observed(created, record, now)
            self._last_renew = now
            return True
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("lease get failed", error=str(error))
            return False

        # 3. Track when the raw record last changed, by our clock.
        current = LeaderRecord.from_lease(lease)
        raw = json.dumps(current.to_spec(), sort_keys=True)
        if raw != self._observed_raw:
            self._set_observed(lease, current, now)
        else:
            self._lease = lease

        # 4. Someone else holds a lease that has not expired (locally judged).
        if current.holder and current.holder != self.identity and self._valid(now):
            return False

        # 5. Take over or renew.
        if current.holder == self.identity:
            record = LeaderRecord(
                self.identity, duration, current.acquire_time, stamp, current.transitions
            )
        else:
            record = LeaderRecord(self.identity, duration, stamp, stamp, current.transitions + 1)
        written = await self._update(lease, record)
        if written is None:
            return False
        self._set_observed(written, record, now)
        self._last_renew = now
        return True

    async def _update(self, lease: JSON, record: LeaderRecord) -> JSON | None:
        """PUT with the read resourceVersion; None on conflict or error."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
            },
            "spec": record.to_spec(),
        }
        try:
            return await self.client.replace(LEASES, self.name, body, self.namespace)
        except KubeApiError as error:
            log.info("lease update failed", status=error.status, reason=error.reason)
            return None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("lease update failed", error=str(error))
            return None

    async def release(self) -> bool:
        """Hand the lease back (empty holder, duration 1 s). Call only after all guarded work
        stopped. Returns False if we did not hold it or the write failed."""
        if not self.is_leader() or self._lease is None or self._observed is None:
            return False
        stamp = format_micro_time(utcnow())
        record = LeaderRecord("", 1, stamp, stamp, self._observed.transitions)
        written = await self._update(self._lease, record)
        self._last_renew = None
        if written is None:
            return False
        self._set_observed(written, record, self.clock())
        return True

    # -- loops ------------------------------------------------------------------------------

    def _jittered(self) -> float:
        return self.retry_period * (1 + random.random() * (JITTER_FACTOR - 1))

    async def acquire(self, stop_event: asyncio.Event | None = None) -> bool:
        """Retry every RetryPeriod (jittered) until we lead; False if stopped first."""
        while stop_event is None or not stop_event.is_set():
            if await self.try_acquire_or_renew():
                return True
            await _sleep_or_stop(self._jittered(), stop_event)
        return False

    async def renew_until_lost(self, stop_event: asyncio.Event | None = None) -> bool:
        """Renew every RetryPeriod; return False once a renewal could not succeed within
        RenewDeadline (leadership lost), True if stopped while still leading."""
        while stop_event is None or not stop_event.is_set():
            await _sleep_or_stop(self.retry_period, stop_event)
            if stop_event is not None and stop_event.is_set():
                return True
            deadline = self.clock() + self.renew_deadline
            renewed = False
            while self.clock() < deadline:
                try:
                    async with asyncio.timeout(max(0.1, deadline - self.clock())):
                        renewed = await self.try_acquire_or_renew()
                except TimeoutError:
                    renewed = False
                if renewed:
                    break
                if not self.holds_lease():
                    break
                await asyncio.sleep(min(self.retry_period / 2, max(0.0, deadline - self.clock())))
            if not renewed:
                return False
        return True

    async def run(
        self,
        on_started: Callable[[], Coroutine[Any, Any, None]],
        on_stopped: Callable[[], Coroutine[Any, Any, None]],
        stop_event: asyncio.Event,
    ) -> None:
        """Elect, lead, and re-enter the election after losing, until `stop_event`.

        `on_started` runs as a task while we lead and is cancelled when leadership is lost;
        `on_stopped` is awaited afterwards. If the leader work ends by itself (or crashes) we
        step down and release the lease. On stop we release the lease too."""
        while not stop_event.is_set():
            if not await self.acquire(stop_event):
                break
            work = asyncio.create_task(on_started())
            renew = asyncio.create_task(self.renew_until_lost(stop_event))
            try:
                await asyncio.wait({work, renew}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (work, renew):
                    task.cancel()
                for task in (work, renew):
                    try:
                        await task
                    except asyncio.CancelledError:
                        if not task.cancelled():
                            raise  # we ourselves are being cancelled
                    except Exception as error:
                        log.error("leader task failed", error=repr(error))
                await on_stopped()
            lost = renew.done() and not renew.cancelled() and renew.result() is False
            if lost:
                log.warning("leadership lost", lease=f"{self.namespace}/{self.name}")
                continue
            await self.release()


async def _sleep_or_stop(seconds: float, stop_event: asyncio.Event | None) -> None:
    if stop_event is None:
        await asyncio.sleep(seconds)
        return
    try:
        async with asyncio.timeout(seconds):
            await stop_event.wait()
    except TimeoutError:
        pass
