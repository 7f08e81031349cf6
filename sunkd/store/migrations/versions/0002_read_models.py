"""SQL read models: views over the events table for audits, Grafana and `sunkd history`.

The read models are plain SQL VIEWS computed from `events` (not tables filled by a
projector), so they are always exactly equal to the log and need no rebuild. Their
semantics are documented in `sunkd/store/projections.py`. The SQL is frozen here:
a later change to a view is a new migration.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Dependency order (each view only uses views above it).
VIEWS = (
    "sunkd_leaders",
    "sunkd_transition_events",
    "sunkd_transition_ends",
    "transitions",
    "sunkd_ownership_changes",
    "ownership_intervals",
    "node_ownership",
    "action_latency",
)


def _sql(dialect: str) -> dict[str, str]:
    """The SELECT of every view for one dialect (postgresql or sqlite)."""
    if dialect == "postgresql":
        def j(field: str, alias: str = "e") -> str:
            return f"({alias}.payload->>'{field}')"

        def seconds(start: str, end: str) -> str:
            return f"EXTRACT(EPOCH FROM ({end} - {start}))::double precision"

        def integer(expression: str) -> str:
            return f"({expression})::bigint"

        def boolean(expression: str) -> str:
            return f"({expression})::boolean"
    else:
        def j(field: str, alias: str = "e") -> str:
            return f"json_extract({alias}.payload, '$.{field}')"

        def seconds(start: str, end: str) -> str:
            # julianday() is a double of days: ~10 us of noise, so round to 1 ms.
            return f"ROUND((julianday({end}) - julianday({start})) * 86400.0, 3)"

        def integer(expression: str) -> str:
            return f"CAST({expression} AS INTEGER)"

        def boolean(expression: str) -> str:
            return f"({expression})"

    node = f"COALESCE(NULLIF({j('node')}, ''), e.subject)"
    return {
        # One identity per leader epoch, from leader.elected.
        "sunkd_leaders": f"""
SELECT {integer(j('epoch'))} AS epoch, MIN({j('identity')}) AS identity
FROM events e WHERE e.kind = 'leader.elected'
GROUP BY {integer(j('epoch'))}""",
        # Every transition.* event, decoded; start_seq = seq of the latest
        # transition.started of the same node at or before this event.
        "sunkd_transition_events": f"""
SELECT t.*, MAX(CASE WHEN t.kind = 'transition.started' THEN t.seq END)
         OVER (PARTITION BY t.node ORDER BY t.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS start_seq
FROM (
  SELECT e.seq, e.recorded_at AS at, e.kind, e.epoch, {node} AS node,
         {j('transition_id')} AS transition_id, {j('pool')} AS pool,
         COALESCE(NULLIF({j('from_owner')}, ''), 'none') AS from_owner,
         {j('to_owner')} AS to_owner, {j('reason')} AS reason
  FROM events e
  WHERE e.kind IN ('transition.started', 'transition.completed', 'transition.aborted')
) t""",
        # The end events the fold honours: the first completed/aborted naming the
        # transition that is open on the node (the latest started one). Owners and
        # pool come from the started event, as in the fold.
        "sunkd_transition_ends": """
SELECT x.* FROM (
  SELECT m.seq, m.at, m.kind, m.epoch, m.node, s.transition_id, s.pool,
         s.from_owner, s.to_owner, m.reason, s.seq AS start_seq,
         ROW_NUMBER() OVER (PARTITION BY m.node, m.start_seq ORDER BY m.seq) AS rn
  FROM sunkd_transition_events m
  JOIN sunkd_transition_events s ON s.seq = m.start_seq
  WHERE m.kind <> 'transition.started' AND s.transition_id = m.transition_id
) x WHERE x.rn = 1""",
        "transitions": f"""
SELECT s.transition_id, s.node, s.pool, s.from_owner, s.to_owner,
       CASE WHEN s.from_owner = 'slurm' AND s.to_owner = 'kubernetes' THEN 'lend'
            WHEN s.from_owner = 'kubernetes' AND s.to_owner = 'slurm' THEN 'reclaim'
            ELSE 'adopt' END AS direction,
       s.at AS started_at,
       COALESCE(x.at, s.next_start_at) AS ended_at,
       CASE WHEN x.kind = 'transition.completed' THEN 'completed'
            WHEN x.kind = 'transition.aborted' THEN 'aborted'
            WHEN s.next_start_at IS NOT NULL THEN 'superseded'
            ELSE 'open' END AS outcome,
       s.reason,
       CASE WHEN x.kind = 'transition.aborted' THEN x.reason END AS abort_reason,
       x.reason AS end_reason,
       {seconds('s.at', 'COALESCE(x.at, s.next_start_at)')} AS duration_s,
       s.epoch, l.identity AS decided_by, s.seq AS start_seq, x.seq AS end_seq
FROM (
  SELECT t.*, LEAD(t.at) OVER (PARTITION BY t.node ORDER BY t.seq) AS next_start_at,
         LEAD(t.seq) OVER (PARTITION BY t.node ORDER BY t.seq) AS next_start_seq
  FROM sunkd_transition_events t WHERE t.kind = 'transition.started'
) s
LEFT JOIN sunkd_transition_ends x
  ON x.start_seq = s.seq AND (s.next_start_seq IS NULL OR x.seq < s.next_start_seq)
LEFT JOIN sunkd_leaders l ON l.epoch = s.epoch""",
        # Where a node's (owner, phase) changes: first observation, transition starts
        # and the end events the fold honours.
        "sunkd_ownership_changes": f"""
SELECT s.seq, s.at, s.node, s.pool, s.from_owner AS owner,
       CASE WHEN s.to_owner = 'kubernetes' THEN 'TO_K8S' ELSE 'TO_SLURM' END AS phase,
       s.transition_id, s.reason, 'started' AS cause, s.epoch
FROM sunkd_transition_events s WHERE s.kind = 'transition.started'
UNION ALL
SELECT x.seq, x.at, x.node, x.pool,
       CASE WHEN x.kind = 'transition.completed' THEN x.to_owner ELSE x.from_owner END,
       CASE CASE WHEN x.kind = 'transition.completed' THEN x.to_owner ELSE x.from_owner END
            WHEN 'slurm' THEN 'SLURM' WHEN 'kubernetes' THEN 'KUBERNETES'
            ELSE 'UNKNOWN' END,
       x.transition_id, x.reason,
       CASE WHEN x.kind = 'transition.completed' THEN 'completed' ELSE 'aborted' END,
       x.epoch
FROM sunkd_transition_ends x
UNION ALL
SELECT f.seq, e.recorded_at, f.node, NULL, 'none', 'UNKNOWN', NULL, 'first observed',
       'observed', e.epoch
FROM (
  SELECT o.node, MIN(o.seq) AS seq FROM (
    SELECT e.seq,
           CASE WHEN e.kind = 'k8s.node.observed'
                THEN COALESCE(NULLIF({j('slurm_node')}, ''), {node})
                ELSE {node} END AS node
    FROM events e WHERE e.kind IN ('slurm.node.observed', 'k8s.node.observed')
  ) o GROUP BY o.node
) f
JOIN events e ON e.seq = f.seq
WHERE NOT EXISTS (SELECT 1 FROM sunkd_transition_events t
                  WHERE t.node = f.node AND t.seq < f.seq)""",
        "ownership_intervals": f"""
SELECT c.node, c.pool, c.owner, c.phase, c.at AS from_at, c.to_at,
       {seconds('c.at', 'c.to_at')} AS duration_s,
       c.transition_id, c.reason, c.cause, c.seq, c.epoch, l.identity AS decided_by
FROM (
  SELECT k.*, LEAD(k.at) OVER (PARTITION BY k.node ORDER BY k.seq) AS to_at
  FROM sunkd_ownership_changes k
) c
LEFT JOIN sunkd_leaders l ON l.epoch = c.epoch AND c.cause <> 'observed'""",
        "node_ownership": """
SELECT i.node, i.pool, i.owner, i.phase, i.from_at AS since, i.transition_id, i.reason,
       i.cause, i.seq
FROM ownership_intervals i WHERE i.to_at IS NULL""",
        "action_latency": f"""
SELECT r.action_id, r.transition_id, r.side, r.verb, r.node, r.attempt, r.reason,
       r.at AS requested_at, o.at AS finished_at,
       CASE o.kind WHEN 'action.succeeded' THEN 'succeeded'
                   WHEN 'action.failed' THEN 'failed' ELSE 'pending' END AS outcome,
       {seconds('r.at', 'o.at')} AS latency_s,
       o.error, o.retryable, r.seq AS request_seq, o.seq AS outcome_seq
FROM (
  SELECT e.seq, e.recorded_at AS at, {j('action_id')} AS action_id,
         NULLIF({j('transition_id')}, '') AS transition_id, {j('side')} AS side,
         {j('verb')} AS verb, {node} AS node, {integer(j('attempt'))} AS attempt,
         {j('reason')} AS reason,
         ROW_NUMBER() OVER (PARTITION BY {j('action_id')} ORDER BY e.seq) AS rn
  FROM events e WHERE e.kind = 'action.requested'
) r
LEFT JOIN (
  SELECT e.seq, e.recorded_at AS at, e.kind, {j('action_id')} AS action_id,
         NULLIF({j('error')}, '') AS error, {boolean(j('retryable'))} AS retryable,
         ROW_NUMBER() OVER (PARTITION BY {j('action_id')} ORDER BY e.seq) AS rn
  FROM events e WHERE e.kind IN ('action.succeeded', 'action.failed')
) o ON o.action_id = r.action_id AND o.rn = 1
WHERE r.rn = 1""",
    }


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    bodies = _sql(dialect)
    for name in VIEWS:
        op.execute(f"CREATE VIEW {name} AS {bodies[name].strip()}")
    # Audits filter transitions by node and time; the (kind, seq) index covers the
    # per-kind scans the views do.
    if dialect == "postgresql":
        op.execute("CREATE INDEX IF NOT EXISTS ix_events_transition_node ON events "
                   "((payload->>'node'), seq) WHERE kind LIKE 'transition.%'")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_events_transition_node")
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
