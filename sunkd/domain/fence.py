"""The optional prolog fence: may Slurm start a job on these nodes, as far as sunkd knows?

A PrologSlurmctld that asks sunkd (`sunkd hook prolog-slurmctld --fence`) can make
slurmctld requeue a job instead of starting it on a node sunkd is handing to Kubernetes:
between the policy's decision to lend and the drain taking effect in Slurm, slurmctld may
still schedule there. Only an explicit "no" refuses a job, because a refused prolog costs
the job a requeue while a wrong "yes" costs nothing the drain would not catch: a node
Kubernetes owns, one being lent, or one being reclaimed that Slurm has not resumed. A node
sunkd does not know, or knows nothing against, is allowed (docs/slurm.md, "Hooks").
"""

from __future__ import annotations

from collections.abc import Sequence

from sunkd.domain import wellknown as wk
from sunkd.domain.policy.model import VERB_RESUME
from sunkd.domain.state import ClusterState

__all__ = ["fence_verdict"]


def fence_verdict(state: ClusterState, nodes: Sequence[str]) -> tuple[bool, str]:
    """(allow, why): False only when some node is Kubernetes-owned or being moved."""
    refusals: list[str] = []
    for name in nodes:
        node = state.nodes.get(name)
        if node is None:
            continue
        transition = node.transition
        if transition is not None and transition.to_owner == wk.OWNER_KUBERNETES:
            refusals.append(f"{name}: being lent to Kubernetes ({transition.reason})"[:200])
        elif transition is not None and transition.from_owner == wk.OWNER_KUBERNETES:
            # A reclaim resumes the node in Slurm as its last Slurm step: from then on
            # Slurm may run jobs there.
            if not transition.did(wk.OWNER_SLURM, VERB_RESUME):
                refusals.append(f"{name}: being reclaimed, not yet resumed in Slurm")
        elif transition is None and node.owner == wk.OWNER_KUBERNETES:
            refusals.append(f"{name}: owned by Kubernetes")
    if refusals:
        return False, "sunkd: " + "; ".join(refusals[:10]) + (
            f" and {len(refusals) - 10} more" if len(refusals) > 10 else "")
    return True, "every node is Slurm's or unknown to sunkd"
