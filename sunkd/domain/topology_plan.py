"""What topology file sunkd hands a running Slurm, and when: a pure decision.

Slurm reads `topology.conf` (or, from 25.05, `topology.yaml`) at start and on
`scontrol reconfigure`. What must never reach it: an empty topology (slurmctld can fail on
it), a node Slurm does not know (its topology plugin refuses the file or leaves the
node out of scheduling), and tree and block lines in one file (one plugin reads it).
So sunkd lists only nodes it gave Slurm (owner `slurm`) that Slurm has registered, keeps
the last good file when the render would be empty or invalid (and says so:
`TopologyApplied=False`), and reconfigures at most once per `min_interval` seconds: a
reconfigure is not free for slurmctld, and labels may churn.

The caller (sunkd/runtime/topology.py) does the I/O: it writes `write` when the plan has
one, runs the reconfigure, and remembers what it wrote and when. Time is an input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodesetObserved, TopologyChoice
from sunkd.domain.slurmnode import registered
from sunkd.domain.state import ClusterState
from sunkd.domain.topology import (
    DEFAULT_PRESET,
    EmptyTopologyError,
    Topology,
    TopologyError,
    TopologyNode,
    TopologySpec,
    conf_kind,
    render,
    spec_from,
    to_conf,
    to_yaml,
)

__all__ = ["Format", "TopologyPlan", "choice_spec",
           "deliverable_nodes", "effective_spec", "plan_for", "plan_topology", "registered",
           "text_of", "topology_nodes"]

Format = Literal["conf", "yaml"]

def deliverable_nodes(state: ClusterState) -> tuple[str, ...]:
    """The Slurm names a topology may list: owned by Slurm and registered in it, sorted."""
    return tuple(sorted(
        name for name, node in state.nodes.items()
        if node.owner == wk.OWNER_SLURM and not node.slurm_missing and registered(node.slurm)))


@dataclass(frozen=True)
class TopologyPlan:
    """`write`: the whole file to write now (then reconfigure), or None. `applied`,
    `reason` and `message` are the `TopologyApplied` condition as things stand."""

    write: str | None
    applied: bool
    reason: str  # Unchanged | Changed | RateLimited | Empty | Invalid
    message: str
    retry_at: float | None = None  # RateLimited: the earliest next write
    topology: Topology | None = None

    @property
    def condition(self) -> Mapping[str, str]:
        return {"type": wk.CONDITION_TOPOLOGY_APPLIED, "status": str(self.applied),
                "reason": self.reason, "message": self.message}


def text_of(topology: Topology, fmt: Format, name: str = "default") -> str:
    return to_yaml(topology, name) if fmt == "yaml" else to_conf(topology)


def plan_topology(nodes: Iterable[TopologyNode], include: Iterable[str], spec: TopologySpec,
                  *, fmt: Format, last_text: str | None, last_write_at: float | None,
                  now: float, min_interval: float, name: str = "default") -> TopologyPlan:
    """Render the topology of `include` (see `deliverable_nodes`) and decide.

    `last_text` is what Slurm was last given successfully (None: nothing yet this run);
    `last_write_at` the last attempt, successful or not (the rate limit counts both)."""
    try:
        topology = render(nodes, include, spec)
    except TopologyError as error:
        kept = "the last good file stays" if last_text is not None else "nothing written"
        reason = "Empty" if isinstance(error, EmptyTopologyError) else "Invalid"
        return TopologyPlan(None, False, reason, f"{error}; {kept}")
    text = text_of(topology, fmt, name)
    if fmt == "conf" and conf_kind(text) != spec.kind:  # belt and braces: never mixed
        return TopologyPlan(None, False, "Invalid",
                            f"rendered {conf_kind(text)} text for a {spec.kind} topology; "
                            "not written", topology=topology)
    listed = len(topology.nodes)
    if text == last_text:
        return TopologyPlan(None, True, "Unchanged", f"{listed} nodes, as Slurm has them",
                            topology=topology)
    if last_write_at is not None and now - last_write_at < min_interval:
        retry = last_write_at + min_interval
        return TopologyPlan(None, False, "RateLimited",
                            f"{listed} nodes to give Slurm; next reconfigure in "
                            f"{retry - now:.0f} s (at most one per {min_interval:g} s)",
                            retry_at=retry, topology=topology)
    return TopologyPlan(text, False, "Changed", f"{listed} nodes to give Slurm",
                        topology=topology)


def topology_nodes(state: ClusterState, objects: Iterable[Mapping[str, Any]]
                   ) -> list[TopologyNode]:
    """Kubernetes Node objects as the renderer's input, named as the fold names them
    (`k8s_names`: a Nodeset's `nodeNameLabel`, `sunkd.io/slurm-node-name`, the Node's
    name), so the topology lists exactly the names Slurm knows from sunkd."""
    out: list[TopologyNode] = []
    for obj in objects:
        node = TopologyNode.from_kubernetes(obj)
        k8s_name = str((obj.get("metadata") or {}).get("name") or "")
        slurm_name = state.k8s_names.get(k8s_name)
        out.append(TopologyNode(slurm_name, node.labels) if slurm_name else node)
    return out


def choice_spec(choice: TopologyChoice) -> TopologySpec:
    """A Nodeset's `spec.topology` as the renderer's spec (TopologyError when unusable)."""
    if choice.error is not None:
        raise TopologyError(choice.error)
    return spec_from("block" if choice.kind == "block" else "tree",
                     preset=choice.preset or DEFAULT_PRESET, levels=choice.levels,
                     block_label=choice.block_label, block_sizes=choice.block_sizes)


def effective_spec(default: TopologySpec, nodesets: Mapping[str, K8sNodesetObserved]
                   ) -> TopologySpec:
    """Slurm has one topology. The Nodesets' `spec.topology` replaces the config's default
    when every Nodeset that sets one sets the same; TopologyError (naming them) when one
    is unusable or two disagree, since choosing one would be a guess."""
    chosen: dict[str, TopologySpec] = {}
    for pool, nodeset in sorted(nodesets.items()):
        if nodeset.deleted or nodeset.topology is None:
            continue
        try:
            chosen[pool] = choice_spec(nodeset.topology)
        except TopologyError as error:
            raise TopologyError(f"Nodeset {pool}: {error}") from error
    specs = set(chosen.values())
    if len(specs) > 1:
        raise TopologyError(f"Nodesets {', '.join(chosen)} ask for different topologies and "
                            "Slurm has one: make their spec.topology equal (or remove it)")
    return specs.pop() if specs else default


def plan_for(state: ClusterState, objects: Iterable[Mapping[str, Any]], default: TopologySpec,
             *, fmt: Format, last_text: str | None, last_write_at: float | None, now: float,
             min_interval: float, name: str = "default") -> TopologyPlan:
    """The whole decision from the fold and the Nodes' labels (`plan_topology`)."""
    try:
        spec = effective_spec(default, state.nodesets)
    except TopologyError as error:
        return TopologyPlan(None, False, "Invalid", f"{error}; the last good file stays")
    return plan_topology(topology_nodes(state, objects), deliverable_nodes(state), spec,
                         fmt=fmt, last_text=last_text, last_write_at=last_write_at, now=now,
                         min_interval=min_interval, name=name)
