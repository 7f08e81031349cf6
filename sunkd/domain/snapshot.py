"""Snapshots: a ClusterState as JSON and back, exactly (a snapshot plus the log's tail
folds to the same state as the whole log; `sunkd replay --check` and the property tests
hold the two to that). Separate from the fold so `state.py` reads as the fold alone.

Format 2 added each node's authorship marks (`authorship`). A format-1 snapshot has none:
restoring it infers them from what it does hold, sunkd's last drain (hold) on the node
having succeeded with nothing of sunkd's undoing it since and the node showing a `sunkd:`
drain (the hold taint) now (`_legacy_marks`). Weaker than the fold's proof (it cannot tell
the text written from the text shown), and only for the one restart after the upgrade;
a full replay (`sunkd replay`, or a daemon whose log has no readable snapshot) proves
every mark from the log itself.
"""


from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from sunkd.domain import authorship as marks
from sunkd.domain import forecast
from sunkd.domain import wellknown as wk
from sunkd.domain.authorship import DrainMark, HoldMark
from sunkd.domain.codec import decode_payload, encode_payload
from sunkd.domain.events import (
    ConfiguredPool,
    K8sDemandObserved,
    K8sNodeObserved,
    K8sNodesetObserved,
    Label,
    Payload,
    PodRef,
    SlurmDemandObserved,
    SlurmNodeObserved,
)
from sunkd.domain.state import (
    ActionOutcome,
    ClusterState,
    NodeState,
    OpenAction,
    OpenTransition,
    Phase,
    Pin,
    SourceState,
    UnpooledNode,
)

# ------------------------------------------------------------------------------ JSON

SNAPSHOT_FORMAT = 2
_LEGACY_FORMATS = frozenset({1})  # restored with inferred marks (`_legacy_marks`)


def _labels_to_json(labels: tuple[Label, ...]) -> list[list[str]]:
    return [[label.key, label.value] for label in labels]


def _labels_from_json(raw: list[list[str]]) -> tuple[Label, ...]:
    return tuple(Label(key, value) for key, value in raw)


def _payload_to_json(payload: Payload | None) -> dict[str, Any] | None:
    return None if payload is None else encode_payload(payload)


def _node_to_json(node: NodeState,
                  reports: Mapping[str, tuple[PodRef, ...]]) -> dict[str, Any]:
    transition = node.transition
    pin = node.pin
    return {
        "name": node.name,
        "pods": _pods_to_node_json(node.pods, reports, node.k8s_name),
        "k8s_name": node.k8s_name,
        "slurm": _payload_to_json(node.slurm),
        "k8s": _payload_to_json(node.k8s),
        "slurm_seq": node.slurm_seq,
        "k8s_seq": node.k8s_seq,
        "slurm_missing": node.slurm_missing,
        "k8s_missing": node.k8s_missing,
        "k8s_rivals": {name: _payload_to_json(obs) for name, obs in node.k8s_rivals.items()},
        "gone_since": node.gone_since,
        "unpooled_since": node.unpooled_since,
        "slurm_unhealthy_since": node.slurm_unhealthy_since,
        "owner": node.owner,
        "phase": node.phase.value,
        "since": node.since,
        "last_move_at": node.last_move_at,
        "transition": None
        if transition is None
        else {
            "transition_id": transition.transition_id,
            "pool": transition.pool,
            "from_owner": transition.from_owner,
            "to_owner": transition.to_owner,
            "started_at": transition.started_at,
            "reason": transition.reason,
            "done_verbs": list(transition.done_verbs),
        },
        "pin": None
        if pin is None
        else {"to": pin.to, "who": pin.who, "why": pin.why, "at": pin.at, "source": pin.source},
        "open_actions": [
            {
                "action_id": a.action_id,
                "transition_id": a.transition_id,
                "side": a.side,
                "verb": a.verb,
                "node": a.node,
                "attempt": a.attempt,
                "reason": a.reason,
                "args": _labels_to_json(a.args),
                "requested_at": a.requested_at,
                "seq": a.seq,
            }
            for a in node.open_actions.values()
        ],
        "outcomes": {
            key: {
                "action_id": o.action_id,
                "transition_id": o.transition_id,
                "succeeded": o.succeeded,
                "attempt": o.attempt,
                "at": o.at,
                "seq": o.seq,
                "error": o.error,
                "retryable": o.retryable,
            }
            for key, o in node.outcomes.items()
        },
        "drain_mark": None if node.drain_mark is None else list(node.drain_mark),
        "hold_mark": None if node.hold_mark is None else list(node.hold_mark),
    }


def _float_or_none(raw: Any) -> float | None:
    return None if raw is None else float(raw)


def _pods_to_json(pods: tuple[PodRef, ...]) -> list[list[Any]]:
    # A slurmd pod's identity only when it has one: most pods keep the short form.
    # The busy label (a tenth field) only when it is on or a revision (the eleventh) follows.
    return [[pod.namespace, pod.name, pod.phase, pod.uid, pod.pool_pod]
            + ([pod.slurmd, pod.slurmd_nodeset, pod.deleting, pod.started_at]
               if pod.slurmd or pod.deleting or pod.slurmd_busy or pod.slurmd_revision
               else [])
            + ([pod.slurmd_busy, pod.slurmd_revision] if pod.slurmd_revision
               else [True] if pod.slurmd_busy else [])
            for pod in pods]


def _pods_from_json(raw: list[list[Any]]) -> tuple[PodRef, ...]:
    # Snapshots before uid/pool_pod carried three fields: [namespace, name, phase]; before
    # slurmd pods, five; before the busy label, at most nine; before slurmd revisions, at
    # most ten.
    return tuple(PodRef(*pod) for pod in raw)


def _pods_to_node_json(pods: tuple[PodRef, ...] | None,
                       reports: Mapping[str, tuple[PodRef, ...]],
                       k8s_name: str | None) -> Any:
    """A node's pods are mostly its claimant's report (`fold.kubernetes._on_workload`): then the
    snapshot says so (True) instead of repeating them; else the list, or None."""
    if pods is not None and k8s_name is not None and reports.get(k8s_name) is pods:
        return True
    return None if pods is None else _pods_to_json(pods)


def _pods_of(raw: Any, k8s_name: str | None,
             reports: Mapping[str, tuple[PodRef, ...]]) -> tuple[PodRef, ...] | None:
    if raw is True:
        return reports[k8s_name] if k8s_name is not None else None
    return None if raw is None else _pods_from_json(raw)


def _legacy_pods(raw: Mapping[str, Any], k8s: K8sNodeObserved | None,
                 reports: Mapping[str, tuple[PodRef, ...]]) -> tuple[PodRef, ...] | None:
    """A node's pods in a snapshot written before they were kept: its claimant's report."""
    if "pods" in raw:
        return _pods_of(raw["pods"], raw["k8s_name"], reports)
    return reports.get(raw["k8s_name"]) if k8s is not None else None


def _legacy_reports(raw: Mapping[str, Any]) -> dict[str, tuple[PodRef, ...]]:
    """Snapshots before per-Node pod reports kept each pool node's pods by pool; each
    pool's list was already the Node's whole list. Nodes without one are unknown until
    the Kubernetes source reports them (it does at its first sync)."""
    reports: dict[str, tuple[PodRef, ...]] = {}
    for node in raw["nodes"]:
        workload = node.get("workload") or {}
        if node.get("k8s") is None or node.get("k8s_name") is None or not workload:
            continue
        merged: dict[tuple[str, str], PodRef] = {}
        for pods in workload.values():
            for pod in _pods_from_json(pods):
                merged[(pod.namespace, pod.name)] = pod
        reports[node["k8s_name"]] = tuple(merged[key] for key in sorted(merged))
    return reports


def _node_from_json(raw: Mapping[str, Any],
                    reports: Mapping[str, tuple[PodRef, ...]]) -> NodeState:
    slurm = raw["slurm"]
    k8s = raw["k8s"]
    transition = raw["transition"]
    pin = raw["pin"]
    slurm_payload = None if slurm is None else decode_payload(SlurmNodeObserved.KIND, slurm)
    k8s_payload = None if k8s is None else decode_payload(K8sNodeObserved.KIND, k8s)
    assert slurm_payload is None or isinstance(slurm_payload, SlurmNodeObserved)
    assert k8s_payload is None or isinstance(k8s_payload, K8sNodeObserved)
    return NodeState(
        pods=_legacy_pods(raw, k8s_payload, reports),
        name=raw["name"],
        k8s_name=raw["k8s_name"],
        slurm=slurm_payload,
        k8s=k8s_payload,
        slurm_seq=raw["slurm_seq"],
        k8s_seq=raw["k8s_seq"],
        slurm_missing=raw["slurm_missing"],
        k8s_missing=raw["k8s_missing"],
        slurm_unhealthy_since=_float_or_none(raw["slurm_unhealthy_since"]),
        owner=raw["owner"],
        phase=Phase(raw["phase"]),
        since=_float_or_none(raw["since"]),
        last_move_at=_float_or_none(raw["last_move_at"]),
        transition=None
        if transition is None
        else OpenTransition(
            transition_id=transition["transition_id"],
            pool=transition["pool"],
            from_owner=transition["from_owner"],
            to_owner=transition["to_owner"],
            started_at=float(transition["started_at"]),
            reason=transition["reason"],
            done_verbs=tuple(transition["done_verbs"]),
        ),
        pin=None
        if pin is None
        else Pin(pin["to"], pin["who"], pin["why"], float(pin["at"]), pin["source"]),
        open_actions={
            a["action_id"]: OpenAction(
                action_id=a["action_id"],
                transition_id=a["transition_id"],
                side=a["side"],
                verb=a["verb"],
                node=a["node"],
                attempt=a["attempt"],
                reason=a["reason"],
                args=_labels_from_json(a["args"]),
                requested_at=float(a["requested_at"]),
                seq=a["seq"],
            )
            for a in raw["open_actions"]
        },
        outcomes={
            key: ActionOutcome(
                action_id=o["action_id"],
                transition_id=o["transition_id"],
                succeeded=o["succeeded"],
                attempt=o["attempt"],
                at=float(o["at"]),
                seq=o["seq"],
                error=o["error"],
                retryable=o["retryable"],
            )
            for key, o in raw["outcomes"].items()
        },
        k8s_rivals={
            name: _k8s_from_json(obs) for name, obs in (raw.get("k8s_rivals") or {}).items()
        },
        gone_since=_float_or_none(raw.get("gone_since")),
        unpooled_since=_float_or_none(raw.get("unpooled_since")),
        drain_mark=_drain_mark_from_json(raw.get("drain_mark")),
        hold_mark=_hold_mark_from_json(raw.get("hold_mark")),
    )


def _drain_mark_from_json(raw: list[Any] | None) -> DrainMark | None:
    if raw is None:
        return None
    # Snapshots before the lifted mark carried four fields.
    reason, reason_time, seen, at, *rest = raw
    return DrainMark(reason, _float_or_none(reason_time), bool(seen), float(at),
                     _float_or_none(rest[0]) if rest else None)


def _hold_mark_from_json(raw: list[Any] | None) -> HoldMark | None:
    if raw is None:
        return None
    key, value, effect, seen, at = raw
    return HoldMark(key, value, effect, bool(seen), float(at))


def _legacy_marks(node: NodeState) -> NodeState:
    """A format-1 node with the marks its outcomes and observations still support: the
    last drain (hold) succeeded, no undrain (unhold) succeeded after it, and Slurm shows a
    `sunkd:` drain (Kubernetes the one hold taint) now. Otherwise no mark: foreign."""
    def last_done(key: str, undo: str) -> float | None:
        done, undone = node.outcomes.get(key), node.outcomes.get(undo)
        if done is None or not done.succeeded:
            return None
        if undone is not None and undone.succeeded and undone.seq > done.seq:
            return None
        return done.at

    drain_mark = hold_mark = None
    slurm = node.slurm
    drained_at = last_done(marks.DRAIN, marks.UNDRAIN)
    if (drained_at is not None and slurm is not None and "DRAIN" in slurm.flags
            and slurm.reason and slurm.reason.startswith(wk.REASON_PREFIX)):
        drain_mark = DrainMark(slurm.reason, slurm.reason_time, True, drained_at)
    held_at = last_done(marks.HOLD, marks.UNHOLD)
    if held_at is not None:
        key, value, effect = marks.hold_taint()
        candidate = HoldMark(key, value, effect, True, held_at)
        hold_mark = candidate if marks.hold_shows(candidate, node.k8s) else None
    return replace(node, drain_mark=drain_mark, hold_mark=hold_mark)


def _unpooled_to_json(name: str, record: UnpooledNode,
                      reports: Mapping[str, tuple[PodRef, ...]]) -> dict[str, Any]:
    return {
        "name": name,
        "pods": _pods_to_node_json(record.pods, reports, record.k8s_name),
        "k8s_name": record.k8s_name,
        "slurm": _payload_to_json(record.slurm),
        "k8s": _payload_to_json(record.k8s),
        "slurm_seq": record.slurm_seq,
        "k8s_seq": record.k8s_seq,
        "slurm_missing": record.slurm_missing,
        "k8s_missing": record.k8s_missing,
        "slurm_unhealthy_since": record.slurm_unhealthy_since,
        "gone_since": record.gone_since,
        "k8s_rivals": {k8s: _payload_to_json(obs) for k8s, obs in record.k8s_rivals.items()},
    }


def _unpooled_from_json(raw: Mapping[str, Any],
                        reports: Mapping[str, tuple[PodRef, ...]]) -> UnpooledNode:
    slurm, k8s = raw["slurm"], raw["k8s"]
    k8s_payload = None if k8s is None else _k8s_from_json(k8s)
    return UnpooledNode(
        pods=_legacy_pods(raw, k8s_payload, reports),
        k8s_name=raw["k8s_name"],
        slurm=None if slurm is None else _decoded(SlurmNodeObserved.KIND, slurm,
                                                  SlurmNodeObserved),
        k8s=k8s_payload,
        slurm_seq=raw["slurm_seq"],
        k8s_seq=raw["k8s_seq"],
        slurm_missing=raw["slurm_missing"],
        k8s_missing=raw["k8s_missing"],
        slurm_unhealthy_since=_float_or_none(raw["slurm_unhealthy_since"]),
        gone_since=_float_or_none(raw["gone_since"]),
        k8s_rivals={k8s_name: _k8s_from_json(obs) for k8s_name, obs in raw["k8s_rivals"].items()},
    )


def _pool_to_json(pool: ConfiguredPool) -> dict[str, Any]:
    return {"name": pool.name, "partitions": list(pool.partitions),
            "node_selector": _labels_to_json(pool.node_selector), "nodes": list(pool.nodes)}


def _pool_from_json(raw: Mapping[str, Any]) -> ConfiguredPool:
    return ConfiguredPool(raw["name"], tuple(raw["partitions"]),
                          _labels_from_json(raw["node_selector"]), tuple(raw["nodes"]))


def _k8s_from_json(raw: Mapping[str, Any]) -> K8sNodeObserved:
    payload = decode_payload(K8sNodeObserved.KIND, raw)
    assert isinstance(payload, K8sNodeObserved)
    return payload


def state_to_json(state: ClusterState) -> dict[str, Any]:
    """A JSON-ready snapshot of `state`; `state_from_json` restores it exactly."""
    return {
        "format": SNAPSHOT_FORMAT,
        "last_seq": state.last_seq,
        "last_recorded_at": state.last_recorded_at,
        "leader_epoch": state.leader_epoch,
        "leader_identity": state.leader_identity,
        "nodes": [_node_to_json(node, state.pod_reports) for node in state.nodes.values()],
        "k8s_names": dict(state.k8s_names),
        # [[Node, pods], ...]: a list, so `state_to_json_text` writes it a Node at a time.
        "pod_reports": [[k8s, _pods_to_json(pods)] for k8s, pods in state.pod_reports.items()],
        "unpooled": [_unpooled_to_json(name, r, state.pod_reports)
                     for name, r in state.unpooled.items()],
        "configured_pools": None if state.configured_pools is None
        else [_pool_to_json(pool) for pool in state.configured_pools],
        "nodesets": {pool: encode_payload(p) for pool, p in state.nodesets.items()},
        "slurm_demand": {part: encode_payload(p) for part, p in state.slurm_demand.items()},
        "k8s_demand": {pool: encode_payload(p) for pool, p in state.k8s_demand.items()},
        "k8s_pending_since": dict(state.k8s_pending_since),
        "k8s_pending_last": {pool: list(run) for pool, run in state.k8s_pending_last.items()},
        "demand_history": {pool: forecast.to_json(summary)
                           for pool, summary in state.demand_history.items()},
        "slurm_head_since": dict(state.slurm_head_since),
        "slurmd_created": {uid: list(names) for uid, names in state.slurmd_created.items()},
        "sources": {
            source: {
                "status": s.status,
                "cause": s.cause,
                "detail": s.detail,
                "since": s.since,
                "last_fresh_at": s.last_fresh_at,
                "epoch": s.epoch,
            }
            for source, s in state.sources.items()
        },
    }


def state_to_json_text(state: ClusterState, dumps: Callable[[Any], str]) -> str:
    """`dumps(state_to_json(state))`, built a node at a time: only one node's JSON tree is
    alive at once, and the text is joined once. The whole tree at 10,000 nodes is hundreds
    of MB of small objects, and each copy of the ~30 MB text another 30 MB; built for every
    snapshot, they left the daemon's RSS that much higher for good (freed, but kept by the
    allocator: bench/scale.py, docs/performance.md)."""
    head = state_to_json(replace(state, nodes={}, unpooled={}, pod_reports={}))
    many: dict[str, Any] = {
        "pod_reports": ([k8s, _pods_to_json(pods)] for k8s, pods in state.pod_reports.items()),
        "nodes": (_node_to_json(node, state.pod_reports) for node in state.nodes.values()),
        "unpooled": (_unpooled_to_json(name, record, state.pod_reports)
                     for name, record in state.unpooled.items()),
    }
    parts = ["{"]
    for key, value in head.items():
        if len(parts) > 1:
            parts.append(",")
        parts.append(dumps(key))
        parts.append(":")
        items = many.get(key)
        if items is None:
            parts.append(dumps(value))
            continue
        parts.append("[")
        for index, item in enumerate(items):
            if index:
                parts.append(",")
            parts.append(dumps(item))
        parts.append("]")
    parts.append("}")
    return "".join(parts)


def _decoded(kind: str, raw: Mapping[str, Any], cls: type[Payload]) -> Any:
    payload = decode_payload(kind, raw)
    if not isinstance(payload, cls):
        raise ValueError(f"snapshot holds a {kind} payload this sunkd cannot decode")
    return payload


def state_from_json(raw: Mapping[str, Any]) -> ClusterState:
    """Restore a snapshot written by `state_to_json`."""
    legacy = raw.get("format") in _LEGACY_FORMATS
    if raw.get("format") != SNAPSHOT_FORMAT and not legacy:
        raise ValueError(f"unsupported snapshot format {raw.get('format')!r}")
    raw_reports = raw.get("pod_reports")
    reports = (_legacy_reports(raw) if raw_reports is None
               else {k8s: _pods_from_json(pods) for k8s, pods in raw_reports})
    nodes = {node["name"]: _node_from_json(node, reports) for node in raw["nodes"]}
    if legacy:
        nodes = {name: _legacy_marks(node) for name, node in nodes.items()}
    return ClusterState(
        nodes=nodes,
        k8s_names=dict(raw["k8s_names"]),
        pod_reports=reports,
        # Both absent in snapshots older than `pools.configured`: every node in `nodes`.
        unpooled={r["name"]: _unpooled_from_json(r, reports)
                  for r in raw.get("unpooled") or ()},
        configured_pools=None if raw.get("configured_pools") is None
        else tuple(_pool_from_json(pool) for pool in raw["configured_pools"]),
        nodesets={
            pool: _decoded(K8sNodesetObserved.KIND, p, K8sNodesetObserved)
            for pool, p in raw["nodesets"].items()
        },
        slurm_demand={
            part: _decoded(SlurmDemandObserved.KIND, p, SlurmDemandObserved)
            for part, p in raw["slurm_demand"].items()
        },
        k8s_demand={
            pool: _decoded(K8sDemandObserved.KIND, p, K8sDemandObserved)
            for pool, p in raw["k8s_demand"].items()
        },
        # Absent in snapshots written before it existed: the next pending list restarts
        # the clock (fold), which only delays the starvation bound, never hastens it.
        k8s_pending_since={
            pool: float(since) for pool, since in raw.get("k8s_pending_since", {}).items()
        },
        # Absent in older snapshots: no starvation ended recently, as after a restart
        # of a log that never had one (the hysteresis only damps, never forces a move).
        k8s_pending_last={
            pool: (float(run[0]), float(run[1]))
            for pool, run in raw.get("k8s_pending_last", {}).items()
        },
        # Absent in older snapshots: the forecast starts cold (today's behaviour).
        demand_history={
            pool: forecast.from_json(summary)
            for pool, summary in raw.get("demand_history", {}).items()
        },
        slurm_head_since={
            part: float(since) for part, since in raw.get("slurm_head_since", {}).items()
        },
        sources={
            source: SourceState(
                status=s["status"],
                cause=s["cause"],
                detail=s["detail"],
                since=float(s["since"]),
                last_fresh_at=_float_or_none(s["last_fresh_at"]),
                epoch=int(s.get("epoch", 0)),
            )
            for source, s in raw["sources"].items()
        },
        leader_epoch=raw["leader_epoch"],
        leader_identity=raw["leader_identity"],
        last_seq=raw["last_seq"],
        last_recorded_at=_float_or_none(raw["last_recorded_at"]),
        # Absent in older snapshots: no record is proven sunkd's until its next create
        # (fail closed: nothing is deleted on it).
        slurmd_created={
            str(uid): tuple(str(n) for n in names)
            for uid, names in raw.get("slurmd_created", {}).items()
        },
    )
