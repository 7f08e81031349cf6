"""The Nodeset `.status` sunkd writes: counters, per-node entries and conditions.

This is the in-cluster mirror of the Slurm side: `kubectl get nds` shows how many
nodes each side owns and `kubectl get nds -o yaml` shows every node's phase and why.
The shape follows the CRD schema (manifests/crds/nodeset.yaml; fields outside it
would be pruned by the API server). Pure formatting, no I/O: the daemon writes it
through `KubernetesActuator.update_nodeset_status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.ownership import assess, explain, slurm_state_text
from sunkd.domain.policy import PoolSpec, membership
from sunkd.domain.policy.slurmd import counts as slurmd_counts
from sunkd.domain.policy.slurmd import nodes_from_state, nodeset_of, revision
from sunkd.domain.policy.slurmdconditions import slurmd_conditions
from sunkd.domain.policy.slurmdfinalizer import deleting_condition, ending_nodeset, plan_end
from sunkd.domain.policy.slurmdfinalizer import nodes_from_state as ending_nodes
from sunkd.domain.state import ClusterState, Phase

PHASE_NAMES = {
    Phase.SLURM: "Slurm",
    Phase.TO_K8S: "ToKubernetes",
    Phase.KUBERNETES: "Kubernetes",
    Phase.TO_SLURM: "ToSlurm",
    Phase.HELD: "Held",
    Phase.UNKNOWN: "Unknown",
}
OWNER_NAMES = {"slurm": "Slurm", "kubernetes": "Kubernetes", "none": "None"}
MAX_NODE_ENTRIES = 500  # keep the object well under etcd's size limit on huge pools


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _slurm_bucket(state: str, flags: tuple[str, ...]) -> str | None:
    if "DRAIN" in flags:
        return "drain"
    lowered = state.lower()
    if lowered in ("idle", "allocated", "mixed", "down"):
        return lowered
    return None


def build_nodeset_status(
    state: ClusterState,
    pools: tuple[PoolSpec, ...],
    pool_name: str,
    generation: int,
    now: float,
    previous_conditions: Mapping[str, Mapping[str, Any]] | None = None,
    member_of: Mapping[str, str] | None = None,
    extra_conditions: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The status for one pool. `previous_conditions` (by type) keep their
    `lastTransitionTime` while their status does not change. `member_of` is
    `membership(state, pools)` when the caller has it (one per round for every pool: at
    10,000 nodes each costs ~0.1 s of the event loop). `extra_conditions` are
    cluster-wide ones computed elsewhere (`{type, status, reason, message}`: the topology
    delivery's `TopologyApplied`, `TopologyPlan.condition`)."""
    if member_of is None:
        member_of = membership(state, pools)
    members = sorted(name for name, pool in member_of.items() if pool == pool_name)
    counts = {"nodes": len(members), "slurm": 0, "kubernetes": 0, "moving": 0, "held": 0,
              "unknown": 0}
    slurm_states = {"idle": 0, "allocated": 0, "mixed": 0, "drain": 0, "down": 0}
    entries: list[dict[str, Any]] = []
    failed_actions = 0
    gres_checked = False  # any member's GPUs are checked ([gres] check)
    gres_bad: list[str] = []
    for name in members:
        node = state.nodes[name]
        assessment = assess(state, node, now)
        gres_checked = gres_checked or (node.k8s is not None and node.k8s.gres is not None)
        if assessment.gres_problem is not None:
            gres_bad.append(f"{name}: {assessment.gres_problem}")
        phase = assessment.phase
        if phase in (Phase.TO_K8S, Phase.TO_SLURM) or node.transition is not None:
            counts["moving"] += 1
        elif phase == Phase.HELD:
            counts["held"] += 1
        elif phase == Phase.UNKNOWN:
            counts["unknown"] += 1
        elif node.owner == "slurm":
            counts["slurm"] += 1
        elif node.owner == "kubernetes":
            counts["kubernetes"] += 1
        slurm_state = None
        if node.slurm is not None:
            slurm_state = slurm_state_text(node.slurm)
            bucket = _slurm_bucket(node.slurm.state, node.slurm.flags)
            if bucket is not None:
                slurm_states[bucket] += 1
        failed_actions += sum(1 for outcome in node.outcomes.values() if not outcome.succeeded)
        reasons = explain(node, assessment)
        entry: dict[str, Any] = {"name": name, "owner": OWNER_NAMES.get(node.owner, "None"),
                                 "phase": PHASE_NAMES[phase]}
        if slurm_state is not None:
            entry["slurmState"] = slurm_state
        if reasons:
            entry["reason"] = "; ".join(reasons)[:1024]
        if node.since is not None:
            entry["since"] = _rfc3339(node.since)
        entries.append(entry)

    wanted = {
        wk.CONDITION_READY:
        ("True", wk.REASON_SOURCES_FRESH, "Slurm and Kubernetes observations are fresh")
        if state.sources_fresh() else
        ("False", wk.REASON_SOURCES_STALE, "a source is stale or lost: sunkd takes no action"),
        wk.CONDITION_PROGRESSING:
        ("True", wk.REASON_MOVING, f"{counts['moving']} node(s) changing owner")
        if counts["moving"] else ("False", wk.REASON_SETTLED, "no node is changing owner"),
        wk.CONDITION_DEGRADED: ("True", wk.REASON_NODES_HELD, f"{counts['held']} node(s) held, "
                     f"{failed_actions} failed action(s) pending retry")
        if counts["held"] or failed_actions else ("False", wk.REASON_AS_EXPECTED, "nothing held"),
    }
    if gres_checked:
        wanted[wk.CONDITION_GRES_CONSISTENT] = (
            ("False", wk.REASON_GRES_MISMATCH,
             f"{len(gres_bad)} node(s) held: " + "; ".join(gres_bad[:5])[:1024])
            if gres_bad else
            ("True", wk.REASON_GRES_MATCH, "Slurm's GRES equals every checked node's GPUs"))
    observed = state.nodesets.get(pool_name)
    nodeset = nodeset_of(observed) if observed is not None else None
    if nodeset is not None:  # spec.slurmd: SlurmdReady, SlurmdProgressing, SlurmdDegraded
        for condition in slurmd_conditions(
                state, nodeset, [state.nodes[name] for name in members], now):
            wanted[condition.type] = (condition.status, condition.reason,
                                      condition.message[:1024])
        ending = ending_nodeset(observed) if observed is not None else None
        if ending is not None and ending.deleting and state.sources_fresh():
            # Terminating: SlurmdProgressing says what the finalizer waits for.
            views, known = ending_nodes(ending, [state.nodes[name] for name in members])
            reason, message = deleting_condition(ending, plan_end(
                ending, views, sources_fresh=True, all_pods_known=known))
            wanted[wk.CONDITION_SLURMD_PROGRESSING] = ("True", reason, message[:1024])
    for extra in extra_conditions:
        wanted[extra["type"]] = (extra["status"], extra["reason"], extra["message"][:1024])
    conditions = []
    for condition_type, (status, reason, message) in wanted.items():
        previous = (previous_conditions or {}).get(condition_type)
        changed_at = (previous.get("lastTransitionTime")
                      if previous is not None and previous.get("status") == status else None)
        conditions.append({
            "type": condition_type, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": changed_at or _rfc3339(now),
            "observedGeneration": generation,
        })
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "counts": counts,
        "slurmStates": slurm_states,
        "nodes": entries[:MAX_NODE_ENTRIES],
        "conditions": conditions,
    }
    if nodeset is not None:  # spec.slurmd: its pods, counted from the reports
        nodes = nodes_from_state(state, nodeset, [state.nodes[name] for name in members], now)
        out["slurmd"] = {**slurmd_counts(nodeset, nodes), "revision": revision(nodeset.spec)}
    return out
