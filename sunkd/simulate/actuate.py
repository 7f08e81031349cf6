"""The actuators' contract, carried out on the simulated world.

What sunkd's Slurm and Kubernetes actuators promise (docs/operations.md, "Actions and
retries"): idempotent verbs that report whether they changed anything, a drain or resume
that refuses someone else's drain, an unlock only on a node Slurm reports drained (the
executor asks Slurm again first), evictions through which the pods' replacements appear.
"""

from __future__ import annotations

from sunkd.domain.ownership import is_ours
from sunkd.domain.state import OpenAction
from sunkd.simulate.records import SimNode
from sunkd.simulate.world import World


def carry_out(world: World, node: SimNode, action: OpenAction, args: dict[str, str],
              t: float, pod_termination: float) -> tuple[str, bool, bool]:
    """Carry out `action` on `node` at `t`: (error or "", retryable, changed)."""
    verb = action.verb
    if verb == "drain":
        if node.drain and not is_ours(node.reason):
            return "refused: drained by someone else", False, False
        changed = not node.drain or node.reason != args.get("reason")
        node.drain, node.reason, node.reason_time = True, args.get("reason"), t
        world.slurm_changed.add(node.index)
        return "", False, changed
    if verb == "resume":
        if not node.drain:
            return "", False, False
        if not is_ours(node.reason) or args.get("expect_reason", node.reason) != node.reason:
            return "refused: the drain reason changed since the decision", False, False
        node.drain, node.reason, node.reason_time = False, None, None
        world.slurm_changed.add(node.index)
        return "", False, True
    if verb == "unlock" and not (node.drain and node.job is None):
        return "Slurm does not report the node drained", True, False
    if verb in ("lock", "unlock", "cordon", "uncordon"):
        attribute = "tainted" if verb in ("lock", "unlock") else "hold"
        want = verb in ("lock", "cordon")
        changed = getattr(node, attribute) != want
        setattr(node, attribute, want)
        world.k8s_changed.add(node.index)
        return "", False, changed
    if verb == "evict":
        names = {label.value.split("/", 1)[1] for label in action.args if label.key == "pod"}
        count = world.evict(node, names, t, pod_termination)
        world.k8s_changed.add(node.index)
        return "", False, count > 0
    if verb == "warn":
        return "", False, True
    return f"unknown verb {verb}", False, False
