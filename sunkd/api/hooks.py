"""`POST /api/v1/slurm/hook`: where `sunkd hook` (Slurm's PrologSlurmctld, EpilogSlurmctld,
Epilog) tells the daemon a job started or ended.

Everything else on the API only reads; this route makes the daemon *do* something (read
slurmrestd at once), so it is guarded: a bearer token of its own (a file only sunkd and
SlurmUser read, never the Slurm JWT), a bounded body that must arrive in time, a rate
limit (a token bucket: `slurm.hook_rate` a second, bursts of ten times that), and a
strict schema. Its content is a hint and nothing more: the receiver (`HookReceiver`,
implemented in `sunkd.runtime.hooks`) reads the named nodes from slurmrestd and only
that reading enters the log, so a forged or replayed hook can at worst cause a read.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson
import structlog
from aiohttp import web

from sunkd.api.metrics import Metrics
from sunkd.domain.events import SlurmHookReceived

log = structlog.get_logger(__name__)

EVENTS = ("prolog-slurmctld", "epilog-slurmctld", "epilog")
MAX_BODY = 16 * 1024  # a hostlist of thousands of nodes fits; the hook cuts at 4 KiB
MAX_NODELIST = 8192
BODY_TIMEOUT = 2.0
BURST = 10.0  # the bucket holds this many seconds' worth of `rate`
TOKEN_RECHECK = 5.0  # the token file is re-read at most this often (rotation)


class BadHook(ValueError):
    """The body is not a hook; the message says which field."""


class HookReceiver(Protocol):
    """What the daemon does with an accepted hook."""

    async def receive(self, hook: SlurmHookReceived, *, fence: bool
                      ) -> tuple[int, Mapping[str, Any], str]:
        """(HTTP status, JSON answer, result label of sunkd_slurm_hook_events_total)."""
        ...


def parse_hook(body: bytes, received_at: float) -> tuple[SlurmHookReceived, bool]:
    """The hook and whether it asks the fence; BadHook names the bad field."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadHook(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadHook("expected a JSON object")
    event = data.get("event")
    if event not in EVENTS:
        raise BadHook(f"event must be one of {', '.join(EVENTS)}")
    job_id = data.get("job_id", 0)
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 <= job_id < 2**63:
        raise BadHook("job_id must be a non-negative integer")
    nodes = data.get("nodes", "")
    if not isinstance(nodes, str) or len(nodes) > MAX_NODELIST:
        raise BadHook(f"nodes must be a hostlist string of at most {MAX_NODELIST} characters")
    partition = data.get("partition", "")
    if not isinstance(partition, str) or len(partition) > 256:
        raise BadHook("partition must be a string of at most 256 characters")
    sent_at = data.get("sent_at")
    if sent_at is not None and (not isinstance(sent_at, int | float) or isinstance(sent_at, bool)
                                or not math.isfinite(sent_at)):
        raise BadHook("sent_at must be a finite number (unix seconds)")
    fence = data.get("fence", False)
    if not isinstance(fence, bool):
        raise BadHook("fence must be true or false")
    hook = SlurmHookReceived(event=event, job_id=job_id, nodes=nodes, partition=partition,
                             sent_at=None if sent_at is None else float(sent_at),
                             received_at=received_at)
    return hook, fence


class TokenBucket:
    """`rate` a second on average, `rate * BURST` at once."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = rate * BURST
        self._tokens = self.capacity
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class HookEndpoint:
    """The route's handler: authenticate, bound, rate-limit, parse, hand over."""

    def __init__(self, receiver: HookReceiver, *, token_file: Path, rate: float,
                 metrics: Metrics, wall_clock: Callable[[], float] = time.time) -> None:
        self.receiver = receiver
        self.token_file = token_file
        self.bucket = TokenBucket(rate)
        self.metrics = metrics
        self._wall = wall_clock
        self._token: bytes | None = None
        self._token_read_at = -math.inf

    def _expected(self) -> bytes | None:
        now = time.monotonic()
        if now - self._token_read_at >= TOKEN_RECHECK:
            self._token_read_at = now
            try:
                self._token = self.token_file.read_bytes()[:4096].strip() or None
            except OSError as error:
                log.warning("slurm.hook.token_unreadable", file=str(self.token_file),
                            error=str(error))
                self._token = None
        return self._token

    def _refuse(self, status: int, result: str, error: str, event: str = "unknown"
                ) -> web.Response:
        self.metrics.hook_events.labels(event=event, result=result).inc()
        return web.json_response({"error": error}, status=status)

    async def handle(self, request: web.Request) -> web.Response:
        received_at = self._wall()
        expected = self._expected()
        if expected is None:
            return self._refuse(503, "no_token", "sunkd cannot read its hook token file")
        header = request.headers.get("Authorization", "")
        given = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
        if not hmac.compare_digest(given, expected):
            log.warning("slurm.hook.unauthorized", peer=request.remote)
            return self._refuse(401, "unauthorized", "bad or missing bearer token")
        if not self.bucket.take():
            return self._refuse(429, "rate_limited", "too many hooks; polling catches up")
        if request.content_length is not None and request.content_length > MAX_BODY:
            return self._refuse(413, "too_large", f"a hook is at most {MAX_BODY} bytes")
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                body = await request.content.read(MAX_BODY + 1)
        except TimeoutError:
            return self._refuse(408, "bad_request", "body not received in time")
        if len(body) > MAX_BODY:
            return self._refuse(413, "too_large", f"a hook is at most {MAX_BODY} bytes")
        try:
            hook, fence = parse_hook(body, received_at)
        except BadHook as error:
            return self._refuse(400, "bad_request", str(error))
        status, answer, result = await self.receiver.receive(hook, fence=fence)
        self.metrics.hook_events.labels(event=hook.event, result=result).inc()
        return web.json_response(dict(answer), status=status)
