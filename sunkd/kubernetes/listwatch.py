"""The informer: list, then watch from the list's resourceVersion, relist on 410 Gone,
back off on trouble, and report what happened (`WatchEvent`, `Relisted`, `WatchTrouble`,
`WatchRecovered`) to the source. Semantics follow client-go's Reflector (staging/src/
k8s.io/client-go/tools/cache/reflector.go): bookmarks move the resume point, a 410 or an
expired resourceVersion means a fresh list."""


from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import aiohttp
import structlog

from sunkd.kubernetes.client import JSON, KubeApiError, KubeClient, ResourceType, WatchLineTooLong
from sunkd.kubernetes.wire import (
    MalformedObject,
    checked_key,
    gc_paused,
    object_key,
    resource_version,
)

log = structlog.get_logger("sunkd.kube")


# ------------------------------------------------------------------------------ backoff


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter (AWS architecture blog; client-go's wait.Jitter
    serves the same purpose): many sunkd replicas or watch loops must not retry in lockstep."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    attempt: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * self.factor**self.attempt)
        self.attempt += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


# ---------------------------------------------------------------------------- ListWatch

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change to one object, as the cache saw it (duplicates already dropped); `object`
    is what the ListWatch's transform made of it."""

    type: EventType
    key: str
    object: Any
    # What the cache held under `key` before this change (None for ADDED): consumers that
    # index the cache unindex it without keeping a copy of their own.
    previous: Any = None


@dataclass(frozen=True, slots=True)
class Relisted:
    """A (re)list finished. `events` reconcile the previous cache with the new list: objects
    that vanished while we were not watching appear as DELETED (client-go's DeletedFinalStateUnknown
    case), changed ones as MODIFIED, new ones as ADDED. On the first list all are ADDED."""

    events: tuple[WatchEvent, ...]
    resource_version: str
    initial: bool
    objects: int


@dataclass(frozen=True, slots=True)
class WatchTrouble:
    """The loop failed to list or watch; it is backing off and will retry."""

    # timeout | connection | gone | server_error | throttled | auth | bad_payload | api |
    # too_large | internal_error
    cause: str
    detail: str
    consecutive: int
    # Stale at once, not only after repeated failures: the view is known to be incomplete
    # (e.g. a watch event too long to read was skipped until the relist).
    immediate: bool = False


@dataclass(frozen=True, slots=True)
class WatchRecovered:
    """The first successful list or watch connection after trouble."""

    after_failures: int


WatchItem = WatchEvent | Relisted | WatchTrouble | WatchRecovered
T = TypeVar("T")


@dataclass(slots=True)
class ListWatchStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    gone: int = 0
    failures: int = 0
    duplicates: int = 0
    rejected: int = 0  # objects refused (MalformedObject): never cached, never observed


class ListWatch(Generic[T]):
    """Informer-style list-then-watch over one resource type; iterate `items()`.

    The cache holds each object after `transform` (drop what you do not need: a relist diff
    only compares resourceVersions, read from a cached object by `version`, so the
    transform may keep anything it likes). A list transforms each page as it arrives, so
    only one page of raw objects is alive at a time (the raw 100,000-pod list
    set the daemon's peak memory).

    One bad object never stops the loop: an object without a usable name, or one
    the transform refuses (`MalformedObject`, or any error in it), is rejected and logged
    with the field at fault. A new object is then not cached; a known one keeps its last
    good version (the last good state stands, as for a bad Slurm poll).
    """

    def __init__(
        self,
        client: KubeClient,
        resource: ResourceType,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: int = 300,
        idle_timeout: float = 90.0,
        page_size: int = 500,
        relist_after_failures: int = 5,
        backoff: Backoff | None = None,
        transform: Callable[[JSON], T] | None = None,
        version: Callable[[T], str] | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.idle_timeout = idle_timeout
        self.page_size = page_size
        self.relist_after_failures = relist_after_failures
        self.backoff = backoff or Backoff()
        self.transform = transform
        # resourceVersion of a cached object (by default the object is API-shaped).
        self.version: Callable[[T], str] = version or resource_version  # type: ignore[assignment]
        self.cache: dict[str, T] = {}
        self.resource_version = ""
        self.stats = ListWatchStats()
        self._log = log.bind(resource=resource.plural)

    def _reconcile(self, items: list[tuple[str | None, T | None]], list_rv: str,
                   initial: bool) -> Relisted:
        with gc_paused():
            return self._reconcile_now(items, list_rv, initial)

    def _reject(self, key: str | None, error: Exception) -> None:
        self.stats.rejected += 1
        field = error.field if isinstance(error, MalformedObject) else "object"
        why = error.why if isinstance(error, MalformedObject) else \
            f"{type(error).__name__}: {error}"
        self._log.warning("kube.object_rejected", key=clean_key(key), field=field,
                          cause=why[:300])

    def _admit(self, item: Any) -> tuple[str | None, T | None]:
        """(key, transformed object); the object is None when it is rejected, and the key
        too when even its identity is unusable."""
        try:
            key = checked_key(item)
        except MalformedObject as error:
            self._reject(None, error)
            return None, None
        try:
            return key, self.transform(item) if self.transform else item
        except Exception as error:
            self._reject(key, error)
            return key, None

    def _reconcile_now(self, items: list[tuple[str | None, T | None]], list_rv: str,
                       initial: bool) -> Relisted:
        fresh: dict[str, T] = {}
        version = self.version
        for key, obj in items:
            if key is None:
                continue
            if obj is None:
                previous = self.cache.get(key)
                if previous is None:
                    continue
                obj = previous  # it exists; its last good version stands
            fresh[key] = obj
        events: list[WatchEvent] = []
        for key, old in self.cache.items():
            if key not in fresh:
                events.append(WatchEvent("DELETED", key, old, old))
        for key, obj in fresh.items():
            old_obj = self.cache.get(key)
            if old_obj is None:
                events.append(WatchEvent("ADDED", key, obj))
            elif version(old_obj) != version(obj):
                events.append(WatchEvent("MODIFIED", key, obj, old_obj))
        self.cache = fresh
        self.resource_version = list_rv
        return Relisted(tuple(events), list_rv, initial, len(fresh))

    def _apply(self, kind: str, obj: JSON) -> WatchEvent | None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"unknown watch event type {kind!r}")
        if kind == "DELETED":
            try:
                key = checked_key(obj)
            except MalformedObject as error:
                self._reject(None, error)
                return None
            old = self.cache.pop(key, None)
            if old is None:
                self.stats.duplicates += 1
                return None
            # The final state is informational (the cache had the object): keep the last
            # good version when the final one does not transform.
            _key, gone = self._admit(obj)
            return WatchEvent("DELETED", key, gone if gone is not None else old, old)
        current = self.cache.get(object_key(obj))
        if current is not None and self.version(current) == resource_version(obj):
            # Replayed event (same object state): nothing changed for us.
            self.stats.duplicates += 1
            return None
        admitted, stored = self._admit(obj)
        if admitted is None or stored is None:
            return None
        previous = self.cache.get(admitted)
        self.cache[admitted] = stored
        return WatchEvent("ADDED" if current is None else "MODIFIED", admitted, stored, previous)

    async def items(self) -> AsyncIterator[WatchItem]:
        """Run forever (until the consumer stops iterating or the task is cancelled)."""
        need_list = True
        initial = True
        failures = 0
        gone_streak = 0
        troubled = False
        while True:
            try:
                if need_list:
                    listed_at = time.monotonic()
                    items, list_rv = await self.client.list_mapped(
                        self.resource,
                        self._admit,
                        namespace=self.namespace,
                        label_selector=self.label_selector,
                        field_selector=self.field_selector,
                        page_size=self.page_size,
                    )
                    self.stats.lists += 1
                    self._log.info("listed", items=len(items),
                                   seconds=round(time.monotonic() - listed_at, 3))
                    relisted = self._reconcile(items, list_rv, initial)
                    # This frame lives as long as the watch: keep neither the list nor
                    # its events once handed over (at 100,000 pods, ~20 MB).
                    del items
                    need_list = False
                    initial = False
                    if troubled:
                        yield WatchRecovered(failures)
                        troubled = False
                    failures = 0
                    self.backoff.reset()
                    yield relisted
                    del relisted
                # client-go jitters the watch timeout in [min, 2*min) so watchers spread out.
                timeout = int(self.watch_timeout * (1 + self.backoff.rng.random()))
                async with self.client.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    timeout_seconds=max(1, timeout),
                    idle_timeout=self.idle_timeout,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                ) as stream:
                    self.stats.watches += 1
                    if troubled:
                        yield WatchRecovered(failures)
                        troubled = False
                    async for raw in stream:
                        if failures:
                            # Data is flowing again: the consecutive-failure count (what
                            # makes the source stale) measures time without progress.
                            failures = 0
                            self.backoff.reset()
                        kind = str(raw.get("type") or "")
                        obj = raw.get("object")
                        if not isinstance(obj, dict):
                            raise ValueError(f"watch event without object: {kind}")
                        if kind == "ERROR":
                            raise _status_error(obj)
                        rv = resource_version(obj)
                        if kind == "BOOKMARK":
                            # Only metadata.resourceVersion is meaningful (API concepts, "Watch
                            # bookmarks").
                            self.stats.bookmarks += 1
                            if rv:
                                self.resource_version = rv
                            continue
                        event = self._apply(kind, obj)
                        if rv:
                            self.resource_version = rv
                        gone_streak = 0
                        if event is not None:
                            self.stats.events += 1
                            yield event
                    # Clean end of the chunked body: the server's timeoutSeconds elapsed (or the
                    # server ended early, which real servers and proxies do: kubernetes_asyncio
                    # #308). Resume from the last resourceVersion, no backoff needed.
                    failures = 0
                    gone_streak = 0
                    self.backoff.reset()
            except KubeApiError as error:
                if error.status == 410:
                    # Expired/Gone: our resourceVersion is older than the server's history.
                    # Resuming cannot work; list again and diff (kubernetes_asyncio#327 retries
                    # with the same stale RV instead).
                    self.stats.gone += 1
                    self._log.info("watch expired, relisting", detail=error.message)
                    need_list = True
                    gone_streak += 1
                    # A single expiry relists at once; back off only when 410s come in a storm
                    # (every relist immediately expiring again), so we never hot-loop on LIST.
                    if gone_streak > 1:
                        await asyncio.sleep(self.backoff.next_delay())
                    continue
                failures += 1
                troubled = True
                self.stats.failures += 1
                cause = _cause_of(error)
                yield WatchTrouble(cause, str(error), failures)
                delay = self.backoff.next_delay()
                if error.retry_after:
                    # The server said when to come back (429/503 Retry-After); honour it, but
                    # never sleep longer than a minute on one header's word.
                    delay = max(delay, min(error.retry_after, 60.0))
                await asyncio.sleep(delay)
                if failures >= self.relist_after_failures:
                    need_list = True
            except WatchLineTooLong as error:
                # The rest of that event is unread: resuming from our resourceVersion would
                # meet it again. A list has no line limit; until it is done, the view misses
                # that change, so the source is stale at once (not after N failures).
                failures += 1
                troubled = True
                self.stats.failures += 1
                need_list = True
                self._log.warning("list/watch failed", cause="too_large", error=str(error),
                                  consecutive=failures)
                yield WatchTrouble("too_large", str(error), failures, immediate=True)
                if failures > 1:
                    await asyncio.sleep(self.backoff.next_delay())
            except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as error:
                # ClientPayloadError on a dropped stream, ServerTimeoutError on a stalled one
                # (half-open connection), connection refused, garbage on the wire.
                failures += 1
                troubled = True
                self.stats.failures += 1
                if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
                    cause = "timeout"
                elif isinstance(error, ValueError):
                    cause = "bad_payload"
                else:
                    cause = "connection"
                self._log.warning(
                    "list/watch failed", cause=cause, error=repr(error), consecutive=failures
                )
                yield WatchTrouble(cause, f"{type(error).__name__}: {error}", failures)
                await asyncio.sleep(self.backoff.next_delay())
                if failures >= self.relist_after_failures:
                    need_list = True
            except Exception as error:
                # Anything else (a bug here or in a transform, a hostile answer of a shape
                # nobody foresaw) must not end the informer: report, back off, list again.
                failures += 1
                troubled = True
                self.stats.failures += 1
                need_list = True
                self._log.exception("list/watch crashed", cause="internal_error",
                                    consecutive=failures)
                yield WatchTrouble("internal_error", f"{type(error).__name__}: {error}",
                                   failures)
                await asyncio.sleep(self.backoff.next_delay())


def clean_key(key: str | None) -> str | None:
    """An object key safe to log (it may come from a rejected, hostile object)."""
    if key is None:
        return None
    return key.encode("unicode_escape").decode("ascii")[:300]


def _status_error(status: Mapping[str, Any]) -> KubeApiError:
    code = status.get("code")
    return KubeApiError(
        int(code) if isinstance(code, int) else 500,
        str(status.get("reason") or ""),
        str(status.get("message") or ""),
        status,
    )


def _cause_of(error: KubeApiError) -> str:
    if error.status in (401, 403):
        return "auth"
    if error.status == 429:
        return "throttled"
    if error.status >= 500:
        return "server_error"
    return "api"
