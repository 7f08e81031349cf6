"""Leadership: the database lease (and the Kubernetes Lease beside it), its renewal,
the one clock, and the question every side effect asks first: may this process act?

A process campaigns for the database lease (`serve`); holding it, it leads one term
at a time (`term.py`). Acting stops as soon as the lease has less than a third left
without a successful renewal, i.e. well before another process can take it over
(`may_act`); a renewal that is late only pauses acting, the term ends when the lease
runs out unrenewed or someone else holds it. With `kubernetes.lease` the
coordination.k8s.io Lease must be held too. A host clock that disagrees with the
database's beyond `max_clock_skew_seconds` pauses acting as well (docs/safety.md,
"Clocks"): the policy's `now` is the database's clock (`clock`), for every caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Awaitable, Callable

import structlog

from sunkd.api.metrics import Metrics
from sunkd.runtime.ports import KubeElector, LeaseStore
from sunkd.store.eventlog import Lease, StaleLeaderError

log = structlog.get_logger(__name__)


class TermEnd(enum.Enum):
    """Why a leadership term ended; the value is the `cause` label of
    `sunkd_leader_terms_ended_total`."""

    SHUTDOWN = "shutdown"
    LEASE_EXPIRED = "lease_expired"  # our renewals failed until the lease ran out
    DEPOSED = "deposed"  # someone else holds the lease (a fenced append, a lost renewal)
    KUBERNETES_LEASE = "kubernetes_lease"  # the Kubernetes Lease was lost or not acquired
    APPENDS_REFUSED = "appends_refused"  # the log took none of our appends for a lease
    ERROR = "error"  # anything else: a task failed, a fatal error, adapters not built


class LeaseExpiredError(StaleLeaderError):
    """Our own renewals failed until the lease ran out (no one else took it, yet)."""


class Leadership:
    """The leases this process holds and how long it may still act on them."""

    def __init__(self, store: LeaseStore, *, identity: str, lease_seconds: float,
                 max_clock_skew: float, metrics: Metrics,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.max_clock_skew = max_clock_skew
        self._metrics = metrics
        self._wall = wall_clock  # this host's clock; the policy's is the database's
        self.lease: Lease | None = None  # held now (a term is running on it)
        self.last_renew_error: str | None = None
        self._stepping_down = False
        self._skew_reported: int | None = None
        self._kube_elector: KubeElector | None = None

    # ----------------------------------------------------------------- questions

    def clock(self) -> float:
        """The policy's `now`: the database's clock (event times are the database's), as
        this host's wall clock plus the offset measured at the last acquire or renew."""
        lease = self.lease
        return self._wall() + (lease.db_offset if lease is not None else 0.0)

    def leading(self) -> bool:
        return self.lease is not None

    def may_act(self) -> bool:
        """Stop acting with a third of the lease left: before anyone can take over."""
        lease = self.lease
        if lease is None or self._stepping_down or self.kube_lease_lost():
            return False
        if abs(lease.db_offset) > self.max_clock_skew:
            self._report_skew(lease.db_offset)
            return False
        return lease.remaining() > lease.lease_seconds / 3

    def paused(self) -> bool:
        """Still the leader, only not acting for now: the clocks disagree too much, or a
        renewal is late (less than the third left that acting needs). Waiting for the
        renewal instead of ending the term keeps the sources fresh: a renewal that waited
        behind a burst of appends used to end the term, and the next one started with
        every source stale."""
        lease = self.lease
        if lease is None or self._stepping_down:
            return False
        remaining, third = lease.remaining(), lease.lease_seconds / 3
        if remaining > third:
            return abs(lease.db_offset) > self.max_clock_skew
        return remaining > 0 and not self.kube_lease_lost()

    def kube_lease_lost(self) -> bool:
        return self._kube_elector is not None and not self._kube_elector.holds_lease()

    def lapse(self) -> tuple[TermEnd, str]:
        """Why the term ended when none of its tasks says so: a lease lapsed."""
        if self.kube_lease_lost():
            return TermEnd.KUBERNETES_LEASE, "the Kubernetes Lease was lost"
        lease = self.lease
        if lease is None:
            return TermEnd.ERROR, "the term ended"
        renew = f"; last renewal error: {self.last_renew_error}" \
            if self.last_renew_error else ""
        return TermEnd.LEASE_EXPIRED, (
            f"the lease was not renewed in time: {max(lease.remaining(), 0.0):.1f} s of "
            f"{lease.lease_seconds:g} s left, less than the third that acting needs{renew}")

    def _report_skew(self, offset: float) -> None:
        if self._skew_reported != round(offset):
            self._skew_reported = round(offset)
            log.error("daemon.clock_skew", offset_seconds=round(offset, 3),
                      limit_seconds=self.max_clock_skew,
                      hint="fix NTP on this host or the database host; sunkd takes no action")

    # ------------------------------------------------------------------ campaign

    async def serve(self, stop: asyncio.Event,
                    lead: Callable[[Lease], Awaitable[TermEnd]]) -> None:
        """Until `stop`: acquire the lease (retrying at a third of its length) and lead
        a term on it. After a term whose appends were refused, leave the lease to a
        standby that can append for one lease length."""
        retry = max(self.lease_seconds / 3, 0.5)
        while not stop.is_set():
            try:
                lease = await self._store.acquire(self.identity, self.lease_seconds)
            except Exception as error:
                log.warning("leadership.acquire_failed", error=str(error))
                self._metrics.acquire_failures.inc()
                lease = None
            self._metrics.set_leader(lease is not None, lease.epoch if lease else 0)
            if lease is None:
                await _wait(stop, retry)
                continue
            end = await lead(lease)
            self._metrics.set_leader(False, lease.epoch)
            if end is TermEnd.APPENDS_REFUSED:
                await _wait(stop, self.lease_seconds)

    def begin(self, lease: Lease) -> None:
        self.lease, self._stepping_down = lease, False
        self.last_renew_error = None
        self._metrics.clock_offset.set(lease.db_offset)

    def step_down(self) -> None:
        """Act no more in this term (its tasks are being stopped)."""
        self._stepping_down = True

    async def release_kube_lease(self) -> None:
        """Give up the Kubernetes Lease (at a term's end, before its client closes)."""
        if self._kube_elector is not None:
            with contextlib.suppress(Exception):
                await self._kube_elector.release()
            self._kube_elector = None

    async def end(self, lease: Lease, *, release: bool) -> None:
        """The term on `lease` is over; with `release`, give the lease up too."""
        if release:
            with contextlib.suppress(Exception):
                await self._store.release(lease)
        self.lease = None

    async def renew_forever(self) -> None:
        """Renew at a third of the lease, measured from the last renewal (not from when
        the previous attempt ended, so a slow attempt does not push the next one back);
        after a failure retry soon. An attempt may take until the lease runs out: acting
        stops on its own at a third left (`may_act`), so a slow renewal costs no safety,
        while giving up on it at a third left used to end terms that a renewal arriving a
        second later would have kept (a busy event loop makes every await late)."""
        while True:
            lease = self.lease
            if lease is None:
                return
            due = lease.remaining() - lease.lease_seconds * 2 / 3
            await asyncio.sleep(0.5 if self.last_renew_error is not None else max(due, 0.0))
            try:
                async with asyncio.timeout(max(lease.remaining(), 1.0)):
                    self.lease = await self._store.renew(lease)
                    self._metrics.clock_offset.set(self.lease.db_offset)
                self.last_renew_error = None
            except StaleLeaderError:
                raise
            except Exception as error:
                # Keep trying; may_act() turns false on its own as the lease runs out.
                self.last_renew_error = f"{type(error).__name__}: {error}"[:300]
                log.warning("leadership.renew_failed", error=self.last_renew_error,
                            remaining=round(lease.remaining(), 1))
                if lease.remaining() <= 0:
                    raise LeaseExpiredError(
                        f"lease expired without renewal ({self.last_renew_error})") from error

    def hold_kube_lease(self, elector: KubeElector) -> None:
        """The Kubernetes Lease was acquired: acting needs it too from now on."""
        self._kube_elector = elector
        log.info("daemon.kube_lease_acquired", identity=self.identity)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
