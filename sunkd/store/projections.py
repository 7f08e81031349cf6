"""SQL read models of the event log: what audits, Grafana and `sunkd history` query.

Why views and not projector-maintained tables: a view over `events` is always exactly
equal to the log (no projector lag, no drift, nothing to repair after a crash), works
the same on PostgreSQL (`payload->>'x'`) and SQLite (`json_extract`), and `sunkd replay
--rebuild` has nothing to rebuild. The cost is paid at query time; audits and
dashboards filter on time and node, and the log's `(kind, seq)` index bounds the
scans to transition and action events, which are a small share of the log.

The views (migration `0002_read_models`; columns in `docs/observability.md`):

`transitions` - one row per `transition.started`:
  transition_id, node, pool, from_owner, to_owner, direction (lend | reclaim | adopt),
  started_at, ended_at, outcome (completed | aborted | open | superseded), reason (why it
  started), abort_reason (aborted only), end_reason, duration_s (ended_at - started_at,
  NULL while open), epoch and decided_by (identity of the leader of that epoch).
  An end event counts exactly when the fold honours it: the first
  `transition.completed`/`aborted` naming the transition open on that node (the latest
  started one). `superseded` (a new start before any end; the policy never does this)
  ends at the next start.

`ownership_intervals` - the (owner, phase) of a node over time, one row per change:
  node, pool, owner, phase, from_at, to_at (NULL for the current interval),
  duration_s (NULL while current), transition_id, reason, cause, seq, epoch, decided_by.
  Boundaries, as in the fold (`sunkd.domain.fold`):
  - `observed`: the node's first `slurm.node.observed`/`k8s.node.observed` (keyed by
    the Slurm node name) opens owner `none`, phase UNKNOWN - a node is nobody's until
    the policy adopts it. Only when it precedes every transition of the node.
  - `started`: `transition.started` opens phase TO_K8S (to kubernetes) or TO_SLURM
    (anything else, including adoption); owner = the transition's from_owner (`none`
    for adoptions): during a move the node still belongs to where it comes from.
  - `completed`: owner = to_owner, phase SLURM or KUBERNETES.
  - `aborted`: owner = from_owner, phase SLURM/KUBERNETES (UNKNOWN for `none`).
  HELD and the UNKNOWN of stale sources are not in the log: they are judged at a given
  moment by `sunkd.domain.ownership.assess` and shown by the live API, not here.
  `reason` is the reason of the event opening the interval (the start reason, the
  completion reason or the abort reason).

`node_ownership` - the current interval of each node: node, pool, owner, phase, since,
  transition_id, reason, cause, seq.

`action_latency` - one row per `action.requested` (first by action_id):
  action_id, transition_id, side, verb, node, attempt, reason, requested_at,
  finished_at, outcome (succeeded | failed | pending), latency_s, error, retryable,
  request_seq, outcome_seq. The outcome is the first succeeded/failed with the id.

Internal helper views (`sunkd_leaders`, `sunkd_transition_events`,
`sunkd_transition_ends`, `sunkd_ownership_changes`) may change without notice.

Timestamps are `timestamptz` on PostgreSQL and SQLAlchemy's naive-UTC text on
SQLite; the helpers below return aware UTC datetimes on both.

Callers reach the views through `ReadModels` (`EventLog.read_models`), never through
SQL of their own. A node the fold knows only from an operator pin (`sunkd pin --force` of
a name never seen: `sunkd.domain.ownership.observed` is false) has no view row.

`read_tolerant` serves the tools that must keep working on a damaged log (through
`EventLog.read_tolerant`): it returns a row sunkd cannot decode as a `CorruptRow` (seq,
kind, raw text, why) instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Text, cast, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from sunkd.domain.codec import decode_payload
from sunkd.domain.events import RecordedEvent
from sunkd.domain.ownership import observed
from sunkd.domain.state import ClusterState
from sunkd.store.migrations_api import SchemaError
from sunkd.store.models import events

READ_MODELS = ("node_ownership", "ownership_intervals", "transitions", "action_latency")


def as_utc(value: Any) -> datetime | None:
    """A view timestamp (datetime on PostgreSQL, text on SQLite) as aware UTC."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def bind_time(dialect: str, moment: datetime) -> Any:
    """A datetime as a bind parameter comparable with view timestamps on `dialect`."""
    moment = moment.astimezone(UTC)
    if dialect == "sqlite":
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f")
    return moment


@dataclass(frozen=True, slots=True)
class Interval:
    """One row of `ownership_intervals`."""

    node: str
    pool: str | None
    owner: str
    phase: str
    from_at: datetime
    to_at: datetime | None
    duration_s: float | None
    transition_id: str | None
    reason: str | None
    cause: str
    decided_by: str | None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["from_at"] = self.from_at.isoformat()
        body["to_at"] = self.to_at.isoformat() if self.to_at else None
        return body


def _interval(row: Mapping[str, Any]) -> Interval:
    from_at = as_utc(row["from_at"])
    assert from_at is not None
    duration = row["duration_s"]
    return Interval(
        node=row["node"], pool=row["pool"], owner=row["owner"], phase=row["phase"],
        from_at=from_at, to_at=as_utc(row["to_at"]),
        duration_s=None if duration is None else float(duration),
        transition_id=row["transition_id"], reason=row["reason"], cause=row["cause"],
        decided_by=row["decided_by"],
    )


async def rows(engine: AsyncEngine, sql: str, params: Mapping[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """Run a read-only query and return its rows as dicts (timestamps left as stored)."""
    async with engine.connect() as connection:
        result = await connection.execute(text(sql), dict(params or {}))
        return [dict(row._mapping) for row in result.all()]


class ReadModels:
    """The views of one log, as the queries callers need (`EventLog.read_models`): the
    SQL and the database's timestamp format stay here."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def rebuild(self) -> None:
        """`sunkd replay --rebuild`: the read models are views, always equal to the log,
        so there is nothing to recompute. Checks that they exist (the schema is at 0002+)
        and raises SchemaError otherwise."""
        async with self._engine.connect() as connection:
            for name in READ_MODELS:
                try:
                    await connection.execute(text(f"SELECT 1 FROM {name} LIMIT 1"))
                except Exception as error:
                    raise SchemaError(f"read model {name} is missing: run `sunkd migrate` "
                                      f"({error})") from error

    async def intervals(
        self,
        *,
        node: str | None = None,
        nodes: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Interval]:
        """Ownership intervals overlapping [since, until), oldest first (by node, then
        time when several nodes are asked for)."""
        dialect = self._engine.dialect.name
        where = ["1 = 1"]
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if node is not None:
            where.append("node = :node")
            params["node"] = node
        if nodes is not None:
            if not nodes:
                return []
            names = {f"n{index}": name for index, name in enumerate(nodes)}
            where.append(f"node IN ({', '.join(':' + key for key in names)})")
            params.update(names)
        if since is not None:
            where.append("(to_at IS NULL OR to_at > :since)")
            params["since"] = bind_time(dialect, since)
        if until is not None:
            where.append("from_at < :until")
            params["until"] = bind_time(dialect, until)
        query = ("SELECT node, pool, owner, phase, from_at, to_at, duration_s, transition_id, "
                 "reason, cause, decided_by FROM ownership_intervals "
                 f"WHERE {' AND '.join(where)} ORDER BY node, seq LIMIT :limit OFFSET :offset")
        return [_interval(row) for row in await rows(self._engine, query, params)]

    async def transitions(self, since: datetime, until: datetime) -> list[dict[str, Any]]:
        """The `transitions` rows started in [since, until), in order (timestamps as
        aware UTC datetimes)."""
        return await self._timed_rows(
            "SELECT transition_id, node, pool, direction, started_at, ended_at, outcome, "
            "reason, abort_reason, duration_s, decided_by FROM transitions "
            "WHERE started_at >= :since AND started_at < :until ORDER BY start_seq",
            since, until, ("started_at", "ended_at"))

    async def failed_actions(self, since: datetime, until: datetime) -> list[dict[str, Any]]:
        """The `action_latency` rows of actions requested in [since, until) that failed,
        in order (timestamps as aware UTC datetimes)."""
        return await self._timed_rows(
            "SELECT action_id, node, side, verb, attempt, requested_at, error, retryable "
            "FROM action_latency WHERE outcome = 'failed' AND requested_at >= :since "
            "AND requested_at < :until ORDER BY request_seq", since, until, ("requested_at",))

    async def _timed_rows(self, sql: str, since: datetime, until: datetime,
                          times: Sequence[str]) -> list[dict[str, Any]]:
        dialect = self._engine.dialect.name
        found = await rows(self._engine, sql, {"since": bind_time(dialect, since),
                                               "until": bind_time(dialect, until)})
        for row in found:
            row.update((key, as_utc(row[key])) for key in times)
        return found

    async def check_against_state(self, state: ClusterState) -> list[str]:
        """Differences between the `node_ownership` view and a folded state (node ->
        owner, and whether a transition is open), for `sunkd replay --check`. Phantom
        nodes (`observed` is false: only pinned) have no row by design."""
        problems: list[str] = []
        view = {row["node"]: row
                for row in await rows(self._engine, "SELECT * FROM node_ownership")}
        for name, node in sorted(state.nodes.items()):
            if not observed(node) and name not in view:
                continue
            row = view.get(name)
            if row is None:
                problems.append(f"node_ownership has no row for {name}")
                continue
            if row["owner"] != node.owner:
                problems.append(f"node_ownership says {name} is owned by {row['owner']!r}, "
                                f"the fold says {node.owner!r}")
            moving = str(row["phase"]).upper() in ("TO_K8S", "TO_SLURM")
            if moving != (node.transition is not None):
                problems.append(f"node_ownership phase of {name} is {row['phase']!r}, the "
                                f"fold's open transition is {node.transition}")
        for name in sorted(set(view) - set(state.nodes)):
            problems.append(f"node_ownership has {name}, which the fold does not know")
        return problems


# ----------------------------------------------------------------- damaged logs


@dataclass(frozen=True, slots=True)
class CorruptRow:
    """A row of `events` whose payload does not decode: not JSON, not an object, or a
    current-version payload with a wrong type (hand-written, or from a broken tool)."""

    seq: int
    recorded_at: datetime | None
    kind: str
    subject: str
    epoch: int
    causation_seq: int | None
    raw: str
    error: str

    def describe(self, raw_chars: int = 200) -> str:
        raw = self.raw if len(self.raw) <= raw_chars else self.raw[:raw_chars] + "..."
        return (f"row seq {self.seq} ({self.kind}, subject {self.subject!r}) is corrupt: "
                f"{self.error}; raw payload {raw!r}")

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "subject": self.subject,
                "epoch": self.epoch, "causation_seq": self.causation_seq,
                "recorded_at": self.recorded_at.isoformat() if self.recorded_at else None,
                "corrupt": True, "error": self.error, "raw": self.raw}


def decode_row(row: Mapping[str, Any]) -> RecordedEvent | CorruptRow:
    """One row (with the payload as text under `raw`) decoded, or the reason it is not."""
    seq, kind, raw = int(row["seq"]), str(row["kind"]), str(row["raw"])
    recorded_at = as_utc(row["recorded_at"])
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError(f"the payload is a JSON {type(body).__name__}, not an object")
        assert recorded_at is not None
        return RecordedEvent(seq=seq, recorded_at=recorded_at, epoch=int(row["epoch"]),
                             subject=row["subject"], payload=decode_payload(kind, body),
                             causation_seq=row["causation_seq"])
    except Exception as error:
        return CorruptRow(seq, recorded_at, kind, str(row["subject"]), int(row["epoch"]),
                          row["causation_seq"], raw, f"{type(error).__name__}: {error}")


async def read_tolerant(engine: AsyncEngine, after_seq: int = 0, limit: int = 1000, *,
                        kinds: Sequence[str] | None = None, subject: str | None = None,
                        upto: int | None = None) -> list[RecordedEvent | CorruptRow]:
    """`EventLog.read`, except that a row that does not decode comes back as a
    `CorruptRow` instead of failing the whole read. Slower (the payload is parsed here,
    from its text): for tools, and for finding the row when the fast read failed."""
    query = (select(events.c.seq, events.c.recorded_at, events.c.kind, events.c.subject,
                    events.c.epoch, events.c.causation_seq,
                    cast(events.c.payload, Text).label("raw"))
             .where(events.c.seq > after_seq).order_by(events.c.seq).limit(limit))
    if upto is not None:
        query = query.where(events.c.seq <= upto)
    if kinds is not None:
        query = query.where(events.c.kind.in_(list(kinds)))
    if subject is not None:
        query = query.where(events.c.subject == subject)
    async with engine.connect() as connection:
        result = (await connection.execute(query)).all()
    return [decode_row(dict(row._mapping)) for row in result]


async def first_corrupt_row(engine: AsyncEngine, after_seq: int = 0,
                            upto: int | None = None, batch: int = 5000) -> CorruptRow | None:
    """The first row after `after_seq` (up to `upto`) that does not decode, if any."""
    position = after_seq
    while True:
        page = await read_tolerant(engine, position, batch, upto=upto)
        for item in page:
            if isinstance(item, CorruptRow):
                return item
        if len(page) < batch:
            return None
        position = page[-1].seq
