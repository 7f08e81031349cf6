"""`sunkd topology render`: the topology sunkd would give Slurm, for operators to review.

Reads Kubernetes Nodes (a `kubectl get nodes -o json|yaml` file, or the live cluster
with sunkd's own credentials), renders topology.conf or topology.yaml with the pure
renderer (sunkd/domain/topology.py) and prints it, optionally as a diff against the
file Slurm has now. Nothing is written anywhere: delivery to Slurm is the daemon's job.
Exit 2, with the reason, when the topology would be empty or mixed, or the input is bad.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from sunkd.domain import wellknown as wk
from sunkd.domain.topology import (
    DEFAULT_PRESET,
    PRESETS,
    Kind,
    TopologyError,
    TopologyNode,
    TopologySpec,
    conf_kind,
    render,
    spec_from,
)
from sunkd.domain.topology_plan import choice_spec, text_of
from sunkd.runtime.config import Settings, topology_spec

__all__ = ["add_arguments", "cmd_topology_render", "load_objects"]


class InputError(ValueError):
    """The nodes file (or the cluster's answer) cannot be used."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, metavar="FILE",
                        help="`kubectl get nodes -o json|yaml` output (a List or one Node; "
                             "may also hold Nodesets); '-' reads stdin. Default: the live "
                             "cluster")
    parser.add_argument("--nodeset", metavar="NS/NAME",
                        help="only this Nodeset's nodes, named by its nodeNameLabel")
    parser.add_argument("--kind", choices=["tree", "block"],
                        help="default: as the daemon would (the Nodeset's spec.topology "
                             "with --nodeset, else [topology] in the config: tree)")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="label names of a provider (default topograph unless "
                             "--levels/--block-label are given)")
    parser.add_argument("--levels", metavar="LABEL,...",
                        help="tree: switch level labels, leaf first")
    parser.add_argument("--block-label", metavar="LABEL", help="block: the label per block")
    parser.add_argument("--block-sizes", metavar="N,...", help="block: BlockSizes")
    parser.add_argument("--all-nodes", action="store_true",
                        help=f"every node, not only those labelled {wk.LABEL_OWNER}="
                             f"{wk.OWNER_SLURM}")
    parser.add_argument("--format", choices=["conf", "yaml"], default="conf",
                        help="topology.conf, or topology.yaml (Slurm 25.05+)")
    parser.add_argument("--diff", type=Path, metavar="PATH",
                        help="show a unified diff against this file instead of the file")
    parser.add_argument("--json", action="store_true")


# ------------------------------------------------------------------------- input


def load_objects(text: str, where: str) -> list[Mapping[str, Any]]:
    """Kubernetes objects from JSON or YAML: a List, one object, or several documents."""
    import yaml  # lazily: `sunkd --help` builds this parser

    try:
        documents = [json.loads(text)]
    except ValueError:
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as error:
            raise InputError(f"{where}: neither JSON nor YAML: {error}") from None
    objects: list[Mapping[str, Any]] = []
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, Mapping):
            raise InputError(f"{where}: expected Kubernetes objects, got {type(document).__name__}")
        items = document.get("items")
        if isinstance(items, list) and str(document.get("kind", "List")).endswith("List"):
            objects.extend(i for i in items if isinstance(i, Mapping))
        else:
            objects.append(document)
    return objects


def _split(objects: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]],
                                                          list[Mapping[str, Any]]]:
    nodes = [o for o in objects if o.get("kind", "Node") == "Node"]
    nodesets = [o for o in objects if o.get("kind") == "Nodeset"]
    return nodes, nodesets


async def _live(settings: Settings, nodeset: str | None
                ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    from sunkd.kubernetes.client import NODES, NODESETS, KubeClient

    kubeconfig = settings.kubernetes.kubeconfig
    client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None,
                                      context=settings.kubernetes.context)
    try:
        nodes, _ = await client.list(NODES)
        nodesets: list[Mapping[str, Any]] = []
        if nodeset:
            namespace, _, name = nodeset.partition("/")
            nodesets.append(await client.get(NODESETS, name, namespace))
        return list(nodes), nodesets
    finally:
        await client.close()


def _select(nodes: Sequence[Mapping[str, Any]], nodesets: Sequence[Mapping[str, Any]],
            nodeset: str | None, all_nodes: bool) -> tuple[list[TopologyNode], list[str]]:
    """The renderer's input and the names it may list."""
    from sunkd.kubernetes.normalize import parse_nodeset

    name_label = None
    selector: dict[str, str] | None = None
    if nodeset:
        if nodeset.count("/") != 1 or not all(nodeset.split("/")):
            raise InputError(f"--nodeset {nodeset!r}: expected NAMESPACE/NAME")
        found = [parse_nodeset(dict(o)) for o in nodesets]
        match = [n for n in found if n.pool == nodeset]
        if not match:
            raise InputError(f"Nodeset {nodeset} not found in the input")
        name_label = match[0].node_name_label
        selector = {label.key: label.value for label in match[0].node_selector}
    chosen: list[TopologyNode] = []
    include: list[str] = []
    for obj in nodes:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if selector is not None and (not selector or any(
                labels.get(k) != v for k, v in selector.items())):
            continue
        node = TopologyNode.from_kubernetes(obj, name_label)
        chosen.append(node)
        if all_nodes or labels.get(wk.LABEL_OWNER) == wk.OWNER_SLURM:
            include.append(node.name)
    return chosen, include


def _ints(text: str | None) -> list[int]:
    try:
        return [int(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        raise TopologyError(f"--block-sizes {text!r}: expected numbers like 18,36") from None


# ------------------------------------------------------------------------ output


def _diff(old_path: Path, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=str(old_path), tofile="rendered"))


def _spec(args: argparse.Namespace, nodesets: Sequence[Mapping[str, Any]],
          default: TopologySpec | None) -> TopologySpec:
    """The flags' spec; without label flags, what the daemon would use: the Nodeset's
    `spec.topology` (with --nodeset), else the config's `[topology]` default."""
    levels = [x.strip() for x in (args.levels or "").split(",") if x.strip()]
    explicit = args.kind or args.preset or levels or args.block_label or args.block_sizes
    if not explicit:
        from sunkd.kubernetes.normalize import parse_nodeset

        chosen = [parse_nodeset(dict(o)).topology for o in nodesets
                  if args.nodeset and parse_nodeset(dict(o)).pool == args.nodeset]
        if chosen and chosen[0] is not None:
            return choice_spec(chosen[0])
        if default is not None:
            return default
    kind: Kind = args.kind or "tree"
    preset = args.preset or (None if levels or args.block_label else DEFAULT_PRESET)
    return spec_from(kind, preset=preset, levels=levels, block_label=args.block_label,
                     block_sizes=_ints(args.block_sizes))


def run(args: argparse.Namespace, objects: tuple[list[Mapping[str, Any]],
                                                 list[Mapping[str, Any]]],
        out: TextIO, err: TextIO, default: TopologySpec | None = None) -> int:
    try:
        spec = _spec(args, objects[1], default)
        nodes, include = _select(objects[0], objects[1], args.nodeset, args.all_nodes)
        topology = render(nodes, include, spec)
    except (TopologyError, InputError) as error:
        if args.json:
            out.write(json.dumps({"ok": False, "error": str(error)}) + "\n")
        else:
            err.write(f"sunkd topology render: {error}\n")
        return 2
    text = text_of(topology, args.format)
    result: dict[str, Any] = {"ok": True, "kind": topology.kind, "format": args.format,
                              "nodes": len(topology.nodes), "text": text,
                              "topology": topology.as_dict()}
    notes: list[str] = []
    if args.diff is not None:
        try:
            old = args.diff.read_text()
        except OSError as error:
            err.write(f"sunkd topology render: cannot read {args.diff}: {error}\n")
            return 2
        result["diff"] = _diff(args.diff, old, text)
        result["changed"] = old != text
        if args.format == "conf" and conf_kind(old) not in (topology.kind, "empty"):
            notes.append(f"{args.diff} is {conf_kind(old)}, the rendered topology is "
                         f"{topology.kind}: Slurm reads one kind per file")
    result["notes"] = notes
    if args.json:
        out.write(json.dumps(result, indent=2) + "\n")
        return 0
    if args.diff is not None:
        out.write(result["diff"] or f"# {args.diff} is up to date\n")
    else:
        out.write(text)
    for name, why in topology.unplaced:
        err.write(f"note: left out {name}: {why}\n")
    for note in notes:
        err.write(f"note: {note}\n")
    return 0


def cmd_topology_render(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.nodes is not None:
            where = "stdin" if str(args.nodes) == "-" else str(args.nodes)
            raw = sys.stdin.read() if where == "stdin" else args.nodes.read_text()
            objects = _split(load_objects(raw, where))
        else:
            objects = asyncio.run(_live(settings, args.nodeset))
    except (OSError, UnicodeDecodeError, InputError) as error:
        print(f"sunkd topology render: {error}", file=sys.stderr)
        return 2
    return run(args, objects, sys.stdout, sys.stderr, topology_spec(settings.topology))
