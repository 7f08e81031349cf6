"""The policy's step for defunct Dynamic Slurm node records: ask to delete each one
`domain/slurmddefunct.py` finds (a Slurm-side action in the log, fenced by the term like
any other; the executor asks Slurm's nodes and jobs again first, the actuator reads the
node once more, and 22.05's slurmrestd, which has no node delete, refuses it with the
`scontrol delete nodename=` line an administrator can run)."""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label
from sunkd.domain.policy.planner import Planner
from sunkd.domain.slurmddefunct import defunct_records, node_of
from sunkd.domain.slurmdgone import VERB_DELETE_NODE
from sunkd.domain.state import NodeState

FEATURE_ARG = "feature"  # the Nodeset's feature the record must still carry


def delete_defunct(planner: Planner) -> None:
    state = planner.state
    for record in defunct_records(state):
        node = node_of(state, record.node)
        if node is None:  # defunct_records found it: never
            continue
        _ensure(planner, node, record.pool, record.nodeset_uid, record.feature, record.why)


def _ensure(planner: Planner, node: NodeState, pool: str, uid: str, feature: str,
            why: str) -> None:
    planner.ensure(
        node, wk.OWNER_SLURM, VERB_DELETE_NODE, f"{wk.REASON_PREFIX} delete {why}",
        args=(Label("nodeset", pool), Label("nodeset_uid", uid), Label(FEATURE_ARG, feature)))
