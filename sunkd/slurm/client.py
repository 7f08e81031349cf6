"""slurmrestd client: version negotiation, HTTP, error mapping.

sunkd has to run against every Slurm an operator may have: Debian 12's 22.05 (REST
v0.0.36-38, read-only for nodes) up to 26.05 (v0.0.42-45). Their JSON comes in three
families (v0.0.38; v0.0.39; v0.0.40+ with `{set,infinite,number}` wrappers), so this
module probes the newest version the server serves, speaks it, and hands the bodies to
`normalize` (one model: `SlurmNode`, `SlurmJob`; errors in `model`; tokens from `auth`).
The behaviours guarded against are documented where they are handled; the sources are
SchedMD's code and live captures (docs/slurm.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import h11
import orjson
import structlog

from sunkd.domain.jsontext import maybe_beyond_64_bits
from sunkd.slurm.auth import DEFAULT_TOKEN_LIFESPAN, TokenSource
from sunkd.slurm.firstanswer import DATA_AFTER_CLOSE, AnswerTooLarge, first_answer
from sunkd.slurm.model import (
    SlurmApiError,
    SlurmAuthError,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmPayloadError,
    SlurmTimeoutError,
    SlurmUnavailableError,
)
from sunkd.slurm.normalize import (
    describe_errors,
    normalize_jobs,
    normalize_nodes,
    slurm_release,
    version_tuple,
)

log = structlog.get_logger(__name__)

# Newest first: negotiation takes the first one the server answers (docs/slurm.md, "Supported
# versions").
SUPPORTED_VERSIONS: tuple[str, ...] = (
    "v0.0.45",
    "v0.0.44",
    "v0.0.43",
    "v0.0.42",
    "v0.0.41",
    "v0.0.40",
    "v0.0.39",
    "v0.0.38",
)
# POST /slurm/vX/node/{name} first appears in v0.0.39 (Slurm 23.02); v0.0.36-38 answer 405.
FIRST_WRITABLE_VERSION = "v0.0.39"

# A stopped slurmctld makes every slurmrestd call block ~9 s before the 500 (measured
# on 22.05.8), so anything shorter than that would misreport a down controller as a
# timeout of slurmrestd itself.
DEFAULT_TIMEOUT = 20.0
# See SlurmRestClient._raise_for: a 22.05 "500 errno -1" slower than this is a down
# slurmctld, faster is a refused JWT.
AMBIGUOUS_500_SLOW = 4.0
# The largest answer read (slurm.max_response_bytes): a 400 MB answer took RSS to
# 1.45 GB before answers were capped. A v0.0.42 node is ~1 KB of JSON, so
# 64 MiB is ~60,000 nodes; `GET /jobs` grows with the queue (a few KB per job).
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
_READ_CHUNK = 256 * 1024

__all__ = [
    "FIRST_WRITABLE_VERSION",
    "SUPPORTED_VERSIONS",
    "SlurmRestClient",
    "SlurmSettingsLike",
    "gather_nodes_and_jobs",
]



# ---------------------------------------------------------------------------- client


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes | bytearray) -> Any:
    """slurmrestd's JSON body, exactly as the stdlib parser (below) reads it. orjson decodes
    a 10,000-node `GET /nodes` several times faster (the stdlib decode was 10 % of the
    daemon's CPU at 1 s polls, docs/performance.md, "Scale"), so it goes first; a body it
    refuses, or one with a 19-digit run, goes through the stdlib, whose error names the
    fault (NaN, nesting: `RecursionError`) and whose integers are exact at any size."""
    if not maybe_beyond_64_bits(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the stdlib says why (or accepts what orjson is stricter about)
    # NaN/Infinity are not JSON (RFC 8259) though Python's parser takes them.
    return json.loads(raw, parse_constant=_refuse_constant)


class SlurmSettingsLike(Protocol):
    """The slice of `sunkd.runtime.config` settings.slurm this module needs (duck typed)."""

    @property
    def url(self) -> str | None: ...
    @property
    def user(self) -> str: ...
    @property
    def token(self) -> str | None: ...
    @property
    def token_file(self) -> Path | None: ...
    @property
    def jwt_key_file(self) -> Path | None: ...


@dataclass
class _Negotiated:
    version: str
    release: str | None
    raw_ping: Mapping[str, Any] = field(default_factory=dict)


class SlurmRestClient:
    """Async slurmrestd client.

    `url` is `http://host:port` (rest_auth/jwt) or `unix:/path/to/socket`
    (rest_auth/local, or jwt). Call `negotiate()` (or use `async with`) before the
    typed calls; it picks the newest served version in `SUPPORTED_VERSIONS`.
    """

    def __init__(
        self,
        url: str,
        *,
        user: str = "root",
        token: str | None = None,
        token_file: Path | None = None,
        jwt_key_file: Path | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        token_lifespan: int = DEFAULT_TOKEN_LIFESPAN,
        versions: Sequence[str] = SUPPORTED_VERSIONS,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if url.startswith("unix:"):
            self._socket_path: str | None = url[len("unix:") :]
            self._base = "http://localhost"
        elif url.startswith(("http://", "https://")):
            self._socket_path = None
            self._base = url.rstrip("/")
        else:
            raise ValueError(f"slurm url must be http://host:port or unix:/path, got {url!r}")
        self.url = url
        self.user = user
        self._tokens = TokenSource(
            user=user,
            token=token,
            token_file=token_file,
            jwt_key_file=jwt_key_file,
            lifespan=token_lifespan,
        )
        self._timeout = timeout
        if max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be positive, got {max_response_bytes!r}")
        self._max_response_bytes = max_response_bytes
        self._versions = tuple(versions)
        self._session: aiohttp.ClientSession | None = None
        self._negotiated: _Negotiated | None = None
        self.last_elapsed = 0.0

    @classmethod
    def from_settings(cls, settings: SlurmSettingsLike, **kwargs: Any) -> SlurmRestClient:
        if not settings.url:
            raise ValueError("slurm.url is not set (http://host:port or unix:/path)")
        timeout = getattr(settings, "request_timeout", None)
        if isinstance(timeout, int | float) and "timeout" not in kwargs:
            kwargs["timeout"] = float(timeout)
        limit = getattr(settings, "max_response_bytes", None)
        if isinstance(limit, int) and "max_response_bytes" not in kwargs:
            kwargs["max_response_bytes"] = limit
        return cls(
            settings.url,
            user=settings.user,
            token=settings.token,
            token_file=settings.token_file,
            jwt_key_file=settings.jwt_key_file,
            **kwargs,
        )

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> SlurmRestClient:
        await self.negotiate()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector
            if self._socket_path is not None:
                connector = aiohttp.UnixConnector(path=self._socket_path)
            else:
                connector = aiohttp.TCPConnector(limit=8)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    # ---------------------------------------------------------------- properties

    @property
    def auth_mode(self) -> str:
        """jwt-token | jwt-token-file | jwt-key | local (unix socket, no JWT) | none."""
        mode = self._tokens.mode
        if mode == "none" and self._socket_path is not None:
            return "local"
        return mode

    @property
    def version(self) -> str:
        if self._negotiated is None:
            raise SlurmError("version not negotiated yet: call negotiate() first")
        return self._negotiated.version

    @property
    def slurm_release(self) -> str | None:
        return self._negotiated.release if self._negotiated else None

    @property
    def can_update_nodes(self) -> bool:
        """REST node update exists from v0.0.39 (Slurm 23.02) on."""
        return version_tuple(self.version) >= version_tuple(FIRST_WRITABLE_VERSION)

    @property
    def can_delete_nodes(self) -> bool:
        """`DELETE /slurm/vX/node/{name}` exists from v0.0.39 (Slurm 23.02) on, with the
        node update (slurmrestd's openapi/slurmctld plugin, nodes.c); 22.05's v0.0.38
        has no delete (only `scontrol delete nodename=`)."""
        return version_tuple(self.version) >= version_tuple(FIRST_WRITABLE_VERSION)

    # ---------------------------------------------------------------- transport

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._tokens.current()
        if token:
            # 22.05 needs both headers (token alone -> 401); 23.02+ accepts both too.
            headers["X-SLURM-USER-NAME"] = self.user
            headers["X-SLURM-USER-TOKEN"] = token
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        allow_404: bool = False,
    ) -> tuple[int, Any]:
        """Raw request; returns (status, parsed JSON or text); `last_elapsed` keeps its
        duration. Maps transport failures
        and auth failures to typed errors; leaves other statuses to the caller."""
        session = self._get_session()
        headers = self._headers()
        data: bytes | None = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        url = self._base + path
        started = time.monotonic()
        for attempt in (1, 2):
            try:
                async with session.request(method, url, headers=headers, data=data) as response:
                    status = response.status
                    content_type = response.content_type
                    raw = await self._read_capped(response, method, path)
                self.last_elapsed = time.monotonic() - started
                break
            except TimeoutError as error:
                raise SlurmTimeoutError(
                    f"{method} {path}: no answer from slurmrestd at {self.url} within "
                    f"{self._timeout:.0f} s"
                ) from error
            except aiohttp.ServerDisconnectedError as error:
                # slurmrestd closes keep-alive connections after errors and after 5 s
                # idle (http.c DEFAULT_KEEP_ALIVE); retry once on a fresh connection.
                if attempt == 2:
                    raise SlurmUnavailableError(
                        f"{method} {path}: slurmrestd at {self.url} closed the connection",
                        cause="unreachable",
                    ) from error
            except aiohttp.ClientConnectionError as error:
                raise SlurmUnavailableError(
                    f"{method} {path}: cannot connect to slurmrestd at {self.url}: {error}",
                    cause="unreachable",
                ) from error
            except aiohttp.ClientPayloadError as error:  # body cut short, bad chunking
                raise SlurmPayloadError(f"{method} {path}", f"incomplete answer body: {error}",
                                        cause="truncated") from error
            except aiohttp.ClientResponseError as error:  # bad status line, bad headers
                # GET and DELETE are idempotent (RFC 9110 section 9.2.2): asking again
                # is harmless (a node deleted by the first ask is then unknown).
                if method in ("GET", "DELETE") and DATA_AFTER_CLOSE in str(error.message):
                    status, content_type, raw = await self._first_answer(method, path,
                                                                         headers)
                    self.last_elapsed = time.monotonic() - started
                    break
                raise SlurmPayloadError(f"{method} {path}",
                                        f"not a valid HTTP answer: {error.message}",
                                        cause="bad_response") from error
            except aiohttp.ClientError as error:  # anything else aiohttp can raise
                raise SlurmPayloadError(f"{method} {path}",
                                        f"{type(error).__name__}: {error}",
                                        cause="bad_response") from error
        if status in (401, 403, 511):
            # 401 text/plain "Authentication failure" (missing/invalid headers);
            # 511 (24.11+) when slurmctld rejects the token.
            self._tokens.invalidate()
            raise SlurmAuthError(
                f"{method} {path}: slurmrestd answered {status} "
                f"({raw[:80].decode(errors='replace').strip()}); {self._tokens.hint()}"
            )
        if status == 404 and allow_404:
            return status, None
        parsed: Any
        if content_type == "application/json" or raw[:1] in (b"{", b"["):
            try:
                parsed = parse_json(raw)
            except ValueError as error:
                raise SlurmPayloadError(f"{method} {path}", f"invalid JSON: {error}") from error
            except RecursionError as error:
                raise SlurmPayloadError(f"{method} {path}",
                                        "invalid JSON: nested too deeply") from error
        else:
            parsed = raw.decode(errors="replace")
        return status, parsed

    async def _first_answer(self, method: str, path: str,
                            headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        """Ask again, reading only the first answer (slurmrestd 26.05's doubled error
        answers: sunkd/slurm/firstanswer.py)."""
        try:
            return await first_answer(method, self._base, path, headers,
                                      socket_path=self._socket_path, time_limit=self._timeout,
                                      max_body=self._max_response_bytes)
        except TimeoutError as error:
            raise SlurmTimeoutError(f"{method} {path}: no answer from slurmrestd at "
                                    f"{self.url} within {self._timeout:.0f} s") from error
        except OSError as error:
            raise SlurmUnavailableError(f"{method} {path}: cannot connect to slurmrestd at "
                                        f"{self.url}: {error}", cause="unreachable") from error
        except AnswerTooLarge as error:
            raise SlurmPayloadError(f"{method} {path}", f"answer of {error} bytes exceeds the "
                                    f"{self._max_response_bytes}-byte limit "
                                    "(slurm.max_response_bytes)", cause="too_large") from error
        except h11.ProtocolError as error:
            raise SlurmPayloadError(f"{method} {path}", f"not a valid HTTP answer: {error}",
                                    cause="bad_response") from error

    async def _read_capped(self, response: aiohttp.ClientResponse, method: str,
                           path: str) -> bytes | bytearray:
        """The body, refused (`too_large`) as soon as it is known to exceed the cap: from
        Content-Length before reading anything, else while streaming."""
        limit = self._max_response_bytes

        def too_large(size: str) -> SlurmPayloadError:
            return SlurmPayloadError(
                f"{method} {path}",
                f"answer of {size} bytes exceeds the {limit}-byte limit "
                "(slurm.max_response_bytes)", cause="too_large")

        length = response.content_length
        if length is not None and length > limit:
            raise too_large(str(length))
        body = bytearray()
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            body += chunk
            if len(body) > limit:
                raise too_large(f"more than {limit}")
        return body

    def _raise_for(
        self, method: str, path: str, status: int, parsed: Any, elapsed: float = 0.0
    ) -> None:
        """Turn a non-success answer into the most precise error we can."""
        errors = parsed.get("errors") if isinstance(parsed, dict) else None
        errors = errors if isinstance(errors, list) else []
        text = describe_errors(errors) if errors else str(parsed)[:200]
        if status in (502, 504):
            # 24.11+: 502 = slurmctld communication error, 504 = timeout.
            raise SlurmUnavailableError(
                f"{method} {path}: slurmctld unreachable ({status}: {text})"
            )
        if status >= 500 and errors:
            numbers = {e.get("error_number", e.get("errno")) for e in errors if isinstance(e, dict)}
            # Slurm errnos 1000-1099 are SLURM_COMMUNICATIONS_* / SLURMCTLD_COMMUNICATIONS_*.
            if any(isinstance(n, int) and 1000 <= n < 1100 for n in numbers):
                if 1007 in numbers:  # SLURM_PROTOCOL_AUTHENTICATION_ERROR
                    self._tokens.invalidate()
                    raise SlurmAuthError(f"{method} {path}: {text}; {self._tokens.hint()}")
                raise SlurmUnavailableError(f"{method} {path}: slurmctld unreachable ({text})")
            if numbers == {-1}:
                # 22.05 answers a bad or expired JWT *and* a stopped slurmctld with the
                # same 500 "Unspecified error" (errno -1); only latency differs: the JWT
                # is refused at once, a down slurmctld costs ~9 s of connect retries
                # (measured on 22.05.8; slurmctld logs "jwt_decode failure").
                if elapsed >= AMBIGUOUS_500_SLOW or self._tokens.mode == "none":
                    raise SlurmUnavailableError(
                        f"{method} {path}: slurmctld not answering ({text}, after {elapsed:.1f} s)"
                    )
                self._tokens.invalidate()
                raise SlurmAuthError(
                    f"{method} {path}: slurmrestd answered 500 ({text}) at once; "
                    f"{self._tokens.hint()}"
                )
        raise SlurmApiError(f"{method} {path}: HTTP {status}: {text}", status=status, errors=errors)

    async def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """A versioned call (`path` relative to /slurm/vX/); errors[] and non-2xx raise."""
        full = f"/slurm/{self.version}/{path.lstrip('/')}"
        status, parsed = await self.request(method, full, body=body)
        if status >= 300:
            self._raise_for(method, full, status, parsed, self.last_elapsed)
        if not isinstance(parsed, dict):
            raise SlurmPayloadError(f"{method} {full}", "expected a JSON object")
        if parsed.get("errors"):
            # HTTP 200 is not success: 24.11 answers GET node/<missing> with 200 + errors[].
            self._raise_for(
                method, full, status if status >= 400 else 500, parsed, self.last_elapsed
            )
        return parsed

    # ---------------------------------------------------------------- API

    async def negotiate(self) -> str:
        """Probe `GET /slurm/vX/ping` newest first; 404 = not served (Slurm-web does the
        same). The first version that answers anything else wins."""
        if self._negotiated is not None:
            return self._negotiated.version
        tried: list[str] = []
        for version in self._versions:
            path = f"/slurm/{version}/ping"
            status, parsed = await self.request("GET", path, allow_404=True)
            if status == 404:
                tried.append(version)
                continue
            if status >= 300 or (isinstance(parsed, dict) and parsed.get("errors")):
                self._raise_for(
                    "GET", path, status if status >= 300 else 500, parsed, self.last_elapsed
                )
            if not isinstance(parsed, dict):
                raise SlurmPayloadError(f"GET {path}", "expected a JSON object")
            self._negotiated = _Negotiated(version, slurm_release(parsed), parsed)
            log.info(
                "slurmrestd.negotiated",
                url=self.url,
                version=version,
                release=self._negotiated.release,
                auth=self.auth_mode,
            )
            return version
        raise SlurmError(
            f"slurmrestd at {self.url} serves none of {', '.join(tried)}: Slurm older than "
            "22.05, or slurmrestd started without these openapi plugins (-s)"
        )

    async def get_nodes_raw(self) -> Any:
        # Never `update_time`: 304-empty or HTTP 500 on every release before 26.05.3.
        return await self.call("GET", "nodes")

    async def get_nodes(self) -> list[SlurmNode]:
        return normalize_nodes(await self.get_nodes_raw())

    async def get_node(self, name: str) -> SlurmNode:
        """Single-node GET. Its allocation data can be stale on 22.05 (docs/slurm.md, "Measured
        behaviour");
        use it only for drain flag and reason, which are current."""
        body = await self.call("GET", f"node/{name}")
        nodes = normalize_nodes(body)
        for node in nodes:
            if node.name == name:
                return node
        raise SlurmApiError(f"GET node/{name}: node not in the answer", status=404)

    async def get_jobs(self) -> list[SlurmJob]:
        return normalize_jobs(await self.call("GET", "jobs"))

    async def update_node(self, name: str, *, state: str, reason: str | None = None) -> None:
        """POST node/{name} (v0.0.39+). `state` is DRAIN, RESUME, UNDRAIN ..."""
        if not self.can_update_nodes:
            raise SlurmError(
                f"slurmrestd {self.version} cannot update nodes (needs {FIRST_WRITABLE_VERSION}+)"
            )
        body: dict[str, Any] = {"state": [state]}
        if reason is not None:
            body["reason"] = reason
        await self.call("POST", f"node/{name}", body)

    async def delete_node(self, name: str) -> None:
        """DELETE node/{name} (v0.0.39+): slurmctld deletes a dynamic node record
        (`delete_nodes` in src/slurmctld/node_mgr.c refuses a node slurm.conf defines and
        one with jobs). Errors raise as for any call (an unknown node included)."""
        if not self.can_delete_nodes:
            raise SlurmError(
                f"slurmrestd {self.version} cannot delete nodes (needs {FIRST_WRITABLE_VERSION}+)"
            )
        await self.call("DELETE", f"node/{name}")


async def gather_nodes_and_jobs(client: SlurmRestClient) -> tuple[list[SlurmNode], list[SlurmJob]]:
    """Both collections, fetched concurrently (each GET is two slurmctld RPCs)."""
    nodes, jobs = await asyncio.gather(client.get_nodes(), client.get_jobs())
    return nodes, jobs
