"""sunkd's safety rules, checked on every round of a simulated run (`--check`).

The same rules the domain's property tests check (tests/unit/test_domain_properties.py),
applied to the decisions `decide` returned on the very state it saw, plus the in-flight
limit on the state after them. Each broken rule is returned as a sentence; a run with
checks on reports how many there were (always 0, or sunkd has a bug).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sunkd.domain import wellknown as wk
from sunkd.domain.ownership import assess, has_hold_taint, is_ours, slurm_drained
from sunkd.domain.policy import (
    CompleteTransition,
    Decision,
    PoolSpec,
    RequestAction,
    StartTransition,
)
from sunkd.domain.state import OWNER_NONE, ClusterState


def check_round(state: ClusterState, now: float, decisions: Sequence[Decision],
                pool: PoolSpec) -> list[str]:
    """Broken rules among `decisions`, decided on `state` at `now`."""
    problems: list[str] = []
    knobs = pool.ownership
    sides: Counter[tuple[str, str]] = Counter()
    for decision in decisions:
        node = state.nodes[decision.node]
        where = f"{decision.node} at {now:.0f}"
        if not assess(state, node, now).actionable:
            problems.append(f"{where}: decided while the node was UNKNOWN: {decision}")
        handing_over = (isinstance(decision, RequestAction) and decision.verb == "unlock") or (
            isinstance(decision, CompleteTransition) and decision.to_owner == wk.OWNER_KUBERNETES)
        if handing_over and not (slurm_drained(node.slurm) and node.slurm is not None
                                 and is_ours(node.slurm.reason)):
            problems.append(f"{where}: handed to Kubernetes while Slurm did not report it "
                            f"drained by sunkd: {decision}")
        if isinstance(decision, RequestAction):
            if node.open_action_on(decision.side) is not None:
                problems.append(f"{where}: second open action on {decision.side}")
            sides[(decision.node, decision.side)] += 1
            if decision.verb == "resume" and not (
                    node.slurm is not None and is_ours(node.slurm.reason)):
                problems.append(f"{where}: resume of a drain that is not sunkd's")
            if decision.verb == "uncordon" and not has_hold_taint(node.k8s):
                problems.append(f"{where}: uncordon without sunkd's hold taint")
            if decision.verb == "drain" and not is_ours(decision.arg("reason")):
                problems.append(f"{where}: drain with a reason that is not sunkd's")
        if (isinstance(decision, StartTransition) and decision.from_owner != OWNER_NONE
                and node.pin is None and knobs.mode == "Auto"
                and node.last_move_at is not None
                and now - node.last_move_at < knobs.dwell_seconds):
            problems.append(f"{where}: moved again within dwell ({knobs.dwell_seconds:g}s)")
    problems += [f"{node} has {count} actions requested on {side} in one round"
                 for (node, side), count in sides.items() if count > 1]
    return problems


def check_in_flight(state: ClusterState, pool: PoolSpec) -> list[str]:
    moving = sum(1 for node in state.nodes.values()
                 if node.transition is not None and node.transition.is_move
                 and node.transition.pool == pool.name)
    if moving > pool.ownership.max_in_flight:
        return [f"{moving} moves in flight, max_in_flight is {pool.ownership.max_in_flight}"]
    return []
