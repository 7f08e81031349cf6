"""Slurm network topology from Kubernetes node labels, rendered without I/O.

Clouds and NVIDIA's Topograph label every GPU node with its place in the fabric (leaf,
spine and core switches; the NVLink domain). Slurm schedules multi-node jobs well only
when `topology.conf` (or, from 25.05, `topology.yaml`) describes that fabric. This
module turns labels into that file: pure, deterministic (input order never matters) and
local (one node's labels change only the lines that name it or its switches).

Tree (`topology/tree`): `levels` are label keys from the leaf upward. A node's switch
path is the contiguous run of levels it carries starting at the leaf; a switch is
identified by its whole path, so two leaves that share a label value under different
spines stay two switches (CoreWeave numbers leaf groups per superpod, for one) and
labels that disagree split a switch rather than invent a link. Switch names are the
level's tag plus the path values; a name over Slurm's 64 characters (topology.conf(5),
SwitchName) or carrying characters Slurm's parser would split on is replaced by the tag
and a hash of the path, the same on every render. When more than one switch has no
parent, a `root` switch joins them: "jobs can only span nodes connected by the same
switch fabric" (topology.conf(5)), and every node of a cluster does reach every other.
Nodes with no level label go under a leaf named `unlabeled`, so they stay schedulable.

Block (`topology/block`, Slurm 23.11+): one block per value of `block_label`. Nodes
without the label, and blocks smaller than the base block size ("each block must have
at least the planning base block size count of nodes", topology.conf(5)), are left out
and reported: a made-up block would claim an NVLink domain that is not there.

Never empty: `render` raises `TopologyError` when nothing would be listed, and callers
keep the last good file. Tree and block never share a file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from sunkd.domain import wellknown as wk
from sunkd.domain.hostlist import compress, is_valid_name

__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "Block",
    "Preset",
    "Switch",
    "Topology",
    "TopologyError",
    "TopologyNode",
    "TopologySpec",
    "conf_kind",
    "render",
    "spec_from",
    "to_conf",
    "to_yaml",
]

Kind = Literal["tree", "block"]

MAX_NAME = 64  # topology.conf(5)/topology.yaml(5): SwitchName "cannot be longer than 64"
ROOT_SWITCH = "root"  # joins the top-level switches (no "_": never a path name)
UNLABELED_SWITCH = "unlabeled"  # leaf of nodes that carry no level label
_SAFE = re.compile(r"[A-Za-z0-9.-]+")  # what a path value may hold unchanged ("_" joins)
_TAG = re.compile(r"[a-z][a-z0-9-]{0,15}")
# Characters that break a Slurm node name inside a topology line (hostlist syntax, the
# conf's key=value and comment syntax, whitespace).
_BAD_NODE = re.compile(r"[\s=#\"'\[\],]")

# ------------------------------------------------------------------------ presets
# Label keys as each provider documents them. Levels are leaf first.

# NVIDIA Topograph, Kubernetes engine (docs.nvidia.com/topograph, "Topograph in
# Kubernetes" and "Node Labels and Annotations"): accelerator = NVLink domain (block),
# leaf / spine / core = switch tiers (tree).
TOPOGRAPH_LEAF = "network.topology.nvidia.com/leaf"
TOPOGRAPH_SPINE = "network.topology.nvidia.com/spine"
TOPOGRAPH_CORE = "network.topology.nvidia.com/core"
TOPOGRAPH_ACCELERATOR = "network.topology.nvidia.com/accelerator"
# CoreWeave CKS (docs.coreweave.com, "InfiniBand labels"): fabric > superpod > leafgroup;
# ds.coreweave.com/nvlink.domain is the NVL72 rack (SUNK builds its blocks from it,
# "Topology/Block plugin" page). Leaf groups are numbered per superpod, hence paths.
COREWEAVE_LEAFGROUP = "ib.coreweave.cloud/leafgroup"
COREWEAVE_SUPERPOD = "ib.coreweave.cloud/superpod"
COREWEAVE_FABRIC = "ib.coreweave.cloud/fabric"
COREWEAVE_NVLINK = "ds.coreweave.com/nvlink.domain"
# Nebius Managed Kubernetes (docs.nebius.com, "Topology-aware scheduling"): tier-0 is the
# accelerator interconnect (multi-node NVLink, only where supported), tier-1 rack-level
# switches, tier-2 spine-level switches.
NEBIUS_TIER0 = "topology.nebius.com/tier-0"
NEBIUS_TIER1 = "topology.nebius.com/tier-1"
NEBIUS_TIER2 = "topology.nebius.com/tier-2"
# Amazon EKS (docs.aws.amazon.com/eks, "Place distributed AI/ML workloads with network
# topology labels"): layer-1 is the top, layer-3 the bottom for most instance types;
# layer-4 exists only on four-layer types and is left out so every node has a leaf.
AWS_LAYER1 = "topology.k8s.aws/network-node-layer-1"
AWS_LAYER2 = "topology.k8s.aws/network-node-layer-2"
AWS_LAYER3 = "topology.k8s.aws/network-node-layer-3"
# GKE (cloud.google.com/ai-hypercomputer, "Schedule GKE workloads with Topology Aware
# Scheduling"): block > subblock > host; a host is one machine, so not a switch. A
# subblock is the NVLink domain on GB200 machine types.
GCP_BLOCK = "cloud.google.com/gce-topology-block"
GCP_SUBBLOCK = "cloud.google.com/gce-topology-subblock"


@dataclass(frozen=True)
class Preset:
    levels: tuple[str, ...]  # tree label keys, leaf first
    tags: tuple[str, ...]  # short names of the levels, used in switch names
    block_label: str | None  # the label whose value names a block


PRESETS: dict[str, Preset] = {
    "topograph": Preset((TOPOGRAPH_LEAF, TOPOGRAPH_SPINE, TOPOGRAPH_CORE),
                        ("leaf", "spine", "core"), TOPOGRAPH_ACCELERATOR),
    "coreweave": Preset((COREWEAVE_LEAFGROUP, COREWEAVE_SUPERPOD, COREWEAVE_FABRIC),
                        ("leafgroup", "superpod", "fabric"), COREWEAVE_NVLINK),
    "nebius": Preset((NEBIUS_TIER1, NEBIUS_TIER2), ("tier1", "tier2"), NEBIUS_TIER0),
    "aws": Preset((AWS_LAYER3, AWS_LAYER2, AWS_LAYER1), ("layer3", "layer2", "layer1"), None),
    "gcp": Preset((GCP_SUBBLOCK, GCP_BLOCK), ("subblock", "block"), GCP_SUBBLOCK),
}


DEFAULT_PRESET = "topograph"  # the labels used when neither config nor Nodeset names any


class TopologyError(ValueError):
    """The topology would be empty, mixed or is misconfigured: keep the last good one."""


class EmptyTopologyError(TopologyError):
    """The topology would list no node (slurmctld must never be given that)."""


# ------------------------------------------------------------------------- input


@dataclass(frozen=True)
class TopologySpec:
    kind: Kind
    levels: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    block_label: str | None = None
    block_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind == "tree":
            if not self.levels:
                raise TopologyError("a tree topology needs at least one level label")
            if self.block_label is not None or self.block_sizes:
                raise TopologyError("tree and block cannot be mixed in one topology")
            if len(self.tags) != len(self.levels):
                raise TopologyError("every tree level needs a tag")
            for tag in self.tags:
                if not _TAG.fullmatch(tag):
                    raise TopologyError(f"level tag {tag!r}: lower case letters, digits, -")
            if len(set(self.levels)) != len(self.levels):
                raise TopologyError("a label appears twice in the tree levels")
        elif self.kind == "block":
            if not self.block_label:
                raise TopologyError("a block topology needs a block label")
            if self.levels:
                raise TopologyError("tree and block cannot be mixed in one topology")
            _check_block_sizes(self.block_sizes)
        else:
            raise TopologyError(f"unknown topology kind {self.kind!r} (tree or block)")


def _check_block_sizes(sizes: Sequence[int]) -> None:
    """topology.conf(5): "Successive BlockSizes must be a power of two larger than the
    prior values"."""
    for size in sizes:
        if size < 1:
            raise TopologyError(f"block size {size} must be at least 1")
    for low, high in pairwise(sizes):
        ratio, remainder = divmod(high, low)
        if remainder or ratio < 2 or ratio & (ratio - 1):
            raise TopologyError(f"block sizes {list(sizes)}: {high} is not {low} times "
                                "a power of two")


def spec_from(kind: Kind, *, preset: str | None = None, levels: Sequence[str] = (),
              block_label: str | None = None, block_sizes: Sequence[int] = ()
              ) -> TopologySpec:
    """A spec from a preset, explicit labels, or a preset with overrides."""
    base = PRESETS.get(preset or "")
    if preset is not None and base is None:
        raise TopologyError(f"unknown preset {preset!r} (one of {', '.join(sorted(PRESETS))})")
    if kind == "tree":
        if block_label or block_sizes:
            raise TopologyError("tree and block cannot be mixed in one topology")
        chosen = tuple(levels) or (base.levels if base else ())
        tags = base.tags if base and not levels else tuple(f"t{i}" for i in range(len(chosen)))
        return TopologySpec("tree", levels=chosen, tags=tags)
    if levels:
        raise TopologyError("tree and block cannot be mixed in one topology")
    label = block_label or (base.block_label if base else None)
    if label is None and base is not None:
        raise TopologyError(f"preset {preset!r} has no block label: give one")
    return TopologySpec("block", block_label=label, block_sizes=tuple(block_sizes))


@dataclass(frozen=True)
class TopologyNode:
    """One Kubernetes Node as the renderer sees it: its Slurm name and labels."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_kubernetes(cls, obj: Mapping[str, Any], name_label: str | None = None
                        ) -> TopologyNode:
        """Slurm name: the Nodeset's `nodeNameLabel`, else `sunkd.io/slurm-node-name`,
        else the Node's name (the same order as the Kubernetes source)."""
        meta = obj.get("metadata") or {}
        raw = meta.get("labels") or {}
        labels = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
        name = (labels.get(name_label, "") if name_label else "") or \
            labels.get(wk.LABEL_SLURM_NODE_NAME, "") or str(meta.get("name") or "")
        return cls(name, labels)


# ------------------------------------------------------------------------ output


@dataclass(frozen=True)
class Switch:
    name: str
    switches: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    path: tuple[str, ...] = ()  # the label values it stands for, top down


@dataclass(frozen=True)
class Block:
    name: str
    nodes: tuple[str, ...]
    value: str = ""  # the label value it stands for


@dataclass(frozen=True)
class Topology:
    kind: Kind
    switches: tuple[Switch, ...] = ()
    blocks: tuple[Block, ...] = ()
    block_sizes: tuple[int, ...] = ()
    unplaced: tuple[tuple[str, str], ...] = ()  # (Slurm node name, why it is left out)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node listed, sorted."""
        if self.kind == "tree":
            return tuple(sorted(n for s in self.switches for n in s.nodes))
        return tuple(sorted(n for b in self.blocks for n in b.nodes))

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "switches": [{"name": s.name, "switches": list(s.switches),
                          "nodes": list(s.nodes), "path": list(s.path)}
                         for s in self.switches],
            "blocks": [{"name": b.name, "nodes": list(b.nodes), "value": b.value}
                       for b in self.blocks],
            "block_sizes": list(self.block_sizes),
            "unplaced": [{"node": n, "reason": r} for n, r in self.unplaced],
        }


# ------------------------------------------------------------------------ render


def _digest(parts: Iterable[str]) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def _name(tag: str, values: Sequence[str]) -> str:
    """`tag_v1_v2`, or `tag__<hash>` when a value is unsafe or the name too long. A
    path name always holds "_" and a hashed one "__", which no readable name can."""
    if all(_SAFE.fullmatch(v) for v in values):
        readable = "_".join((tag, *values))
        if len(readable) <= MAX_NAME:
            return readable
    return f"{tag}__{_digest((tag, *values))}"


def _node_problem(name: str) -> str | None:
    if not name or not is_valid_name(name) or _BAD_NODE.search(name):
        return "not a name Slurm can read in a topology line"
    if len(name) > MAX_NAME:
        return f"longer than {MAX_NAME} characters"
    return None


def _usable(nodes: Iterable[TopologyNode], include: Iterable[str]
            ) -> tuple[dict[str, Mapping[str, str]], list[tuple[str, str]]]:
    """The included nodes with good, unique names; the rest with a reason."""
    wanted = set(include)
    seen: dict[str, list[Mapping[str, str]]] = {}
    for node in nodes:
        if node.name in wanted:
            seen.setdefault(node.name, []).append(node.labels)
    usable: dict[str, Mapping[str, str]] = {}
    unplaced: list[tuple[str, str]] = []
    for name, labels in seen.items():
        problem = _node_problem(name)
        if problem is None and len(labels) > 1 and any(x != labels[0] for x in labels):
            problem = "two Kubernetes Nodes with different labels claim this Slurm name"
        if problem is not None:
            unplaced.append((name, problem))
        else:
            usable[name] = labels[0]
    return usable, unplaced


def render(nodes: Iterable[TopologyNode], include: Iterable[str], spec: TopologySpec
           ) -> Topology:
    """The topology of the `include`d nodes (Slurm-owned and registered, decided by the
    caller). Raises TopologyError when it would list no node."""
    usable, unplaced = _usable(nodes, include)
    if spec.kind == "tree":
        topology = _tree(usable, spec)
    else:
        topology = _blocks(usable, spec)
        unplaced.extend(topology.unplaced)
    result = Topology(spec.kind, topology.switches, topology.blocks, topology.block_sizes,
                      tuple(sorted(unplaced)))
    if not result.nodes:
        why = "; ".join(f"{n}: {r}" for n, r in result.unplaced[:5])
        raise EmptyTopologyError("the topology would list no node" + (f" ({why})" if why else
                                                                  " (no node given)"))
    return result


def _tree(usable: Mapping[str, Mapping[str, str]], spec: TopologySpec) -> Topology:
    leaves: dict[tuple[str, ...], set[str]] = {}  # top-down path of a leaf -> nodes
    unlabeled: list[str] = []
    for name, labels in usable.items():
        upward: list[str] = []
        for label in spec.levels:
            value = labels.get(label, "")
            if not value:
                break
            upward.append(value)
        if upward:
            leaves.setdefault(tuple(reversed(upward)), set()).add(name)
        else:
            unlabeled.append(name)
    # Every prefix of a leaf path is a switch, keyed by its level (counted from the
    # leaf) and path: leaves are level 0, so no switch has both nodes and switches.
    names: dict[tuple[int, tuple[str, ...]], str] = {}
    children: dict[tuple[int, tuple[str, ...]], set[str]] = {}
    for path in leaves:
        for end in range(1, len(path) + 1):
            key = (len(path) - end, path[:end])
            names[key] = _name(spec.tags[key[0]], key[1])
            if end > 1:
                children.setdefault((key[0] + 1, path[:end - 1]), set()).add(names[key])
    fixed = [Switch(name, switches=tuple(sorted(children.get(key, ()))),
                    nodes=tuple(sorted(leaves.get(key[1], ()) if key[0] == 0 else ())),
                    path=key[1])
             for key, name in names.items()]
    if unlabeled:
        fixed.append(Switch(UNLABELED_SWITCH, nodes=tuple(sorted(unlabeled))))
    tops = [s.name for s in fixed if len(s.path) <= 1]
    if len(tops) > 1:
        fixed.append(Switch(ROOT_SWITCH, switches=tuple(sorted(tops))))
    return Topology("tree", switches=tuple(sorted(fixed, key=lambda s: s.name)))


def _blocks(usable: Mapping[str, Mapping[str, str]], spec: TopologySpec) -> Topology:
    label = spec.block_label or ""
    groups: dict[str, set[str]] = {}
    unplaced: list[tuple[str, str]] = []
    for name, labels in usable.items():
        value = labels.get(label, "")
        if value:
            groups.setdefault(value, set()).add(name)
        else:
            unplaced.append((name, f"no {label} label"))
    base = spec.block_sizes[0] if spec.block_sizes else 1
    blocks: list[Block] = []
    for value, members in groups.items():
        if len(members) < base:
            unplaced.extend((n, f"block {value!r} has {len(members)} nodes, fewer than the "
                                f"base block size {base}") for n in members)
            continue
        blocks.append(Block(_name("b", (value,)), tuple(sorted(members)), value))
    return Topology("block", blocks=tuple(sorted(blocks, key=lambda b: b.name)),
                    block_sizes=spec.block_sizes, unplaced=tuple(unplaced))


# ----------------------------------------------------------------------- formats


def _hostlist(names: Sequence[str]) -> str:
    return compress(list(names), sort=True)


def to_conf(topology: Topology) -> str:
    """topology.conf(5): one line per switch or block, sorted by name; a hashed name is
    preceded by a comment with the label values it stands for."""
    lines = [f"# generated by sunkd: topology/{topology.kind}"]
    if topology.kind == "tree":
        for s in topology.switches:
            if "__" in s.name:
                lines.append(f"# {s.name}: {' / '.join(_comment(v) for v in s.path)}")
            line = f"SwitchName={s.name}"
            if s.switches:
                line += f" Switches={_hostlist(s.switches)}"
            if s.nodes:
                line += f" Nodes={_hostlist(s.nodes)}"
            lines.append(line)
    else:
        for b in topology.blocks:
            if "__" in b.name:
                lines.append(f"# {b.name}: {_comment(b.value)}")
            lines.append(f"BlockName={b.name} Nodes={_hostlist(b.nodes)}")
        if topology.block_sizes:
            lines.append("BlockSizes=" + ",".join(str(s) for s in topology.block_sizes))
    return "\n".join(lines) + "\n"


def _comment(value: str) -> str:
    """A label value made safe for one comment line."""
    return json.dumps(value)[1:-1]


def to_yaml(topology: Topology, name: str = "default") -> str:
    """topology.yaml(5) (Slurm 25.05+): one topology, the cluster default. Scalars are
    JSON-quoted, which YAML reads as the same strings."""
    q = json.dumps
    lines = ["# generated by sunkd", f"- topology: {q(name)}", "  cluster_default: true"]
    if topology.kind == "tree":
        lines += ["  tree:", "    switches:"]
        for s in topology.switches:
            lines.append(f"      - switch: {q(s.name)}")
            if s.switches:
                lines.append(f"        children: {q(_hostlist(s.switches))}")
            if s.nodes:
                lines.append(f"        nodes: {q(_hostlist(s.nodes))}")
    else:
        lines += ["  block:"]
        if topology.block_sizes:
            lines.append("    block_sizes: [" + ", ".join(map(str, topology.block_sizes)) + "]")
        lines.append("    blocks:")
        for b in topology.blocks:
            lines.append(f"      - block: {q(b.name)}")
            lines.append(f"        nodes: {q(_hostlist(b.nodes))}")
    return "\n".join(lines) + "\n"


def conf_kind(text: str) -> Literal["tree", "block", "mixed", "empty"]:
    """What a topology.conf holds: SwitchName lines, BlockName lines, both, or neither."""
    tree = block = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip().lower()
        tree = tree or line.startswith("switchname=")
        block = block or line.startswith(("blockname=", "blocksizes="))
    if tree and block:
        return "mixed"
    return "tree" if tree else "block" if block else "empty"
