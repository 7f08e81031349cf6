"""`sunkd doctor`'s Nodeset half: for each Nodeset that runs slurmd pods (`spec.slurmd`),
what slurm.conf must hold, checked against what slurmctld reports
(`sunkd/slurm/nodeset_checks.py`), with the lines to add.

The reads are here and nowhere else: the Nodesets and Nodes from the API server (with
sunkd's own credentials, as the daemon reads them), `scontrol show config` and
`scontrol show partition -o` from slurmctld, and the node names slurmrestd gave the rest
of the doctor. A read that fails is carried as None and its checks say *unknown*, never
ok; `nodeset_facts` and `render` are pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sunkd.domain.ports import ActionError
from sunkd.slurm.nodeset_checks import (
    NodesetFacts,
    NodesetNode,
    Partition,
    nodeset_findings,
    parse_show_partitions,
)
from sunkd.slurm.prerequisites import parse_show_config
from sunkd.slurm.scontrol import run_scontrol

__all__ = ["SlurmReads", "nodeset_facts", "nodesets_report", "read_slurm", "render"]


def _address(node: Mapping[str, Any]) -> str | None:
    for address in (node.get("status") or {}).get("addresses") or []:
        if isinstance(address, Mapping) and address.get("type") == "InternalIP" \
                and address.get("address"):
            return str(address["address"])
    return None


def nodeset_facts(nodeset: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] | None
                  ) -> NodesetFacts | str | None:
    """One Nodeset as the checks see it: None without `spec.slurmd` (sunkd runs no pods
    for it, nothing to check), the error text when sunkd would refuse it as malformed
    (it then acts on none of it), else its facts. `nodes` None: the Nodes were not read."""
    from sunkd.kubernetes.normalize import parse_nodeset, selector_matches, slurm_node_name
    from sunkd.kubernetes.wire import MalformedObject

    if (nodeset.get("spec") or {}).get("slurmd") is None:
        return None
    try:
        parsed = parse_nodeset(dict(nodeset))
    except MalformedObject as error:
        return str(error)
    spec = parsed.slurmd
    if spec is None:  # pragma: no cover - spec.slurmd present parses to a spec or raises
        return None
    selected: tuple[NodesetNode, ...] | None = None
    if nodes is not None:
        chosen = []
        for node in nodes:
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            if selector_matches(parsed.node_selector, labels):
                name = str(meta.get("name") or "")
                chosen.append(NodesetNode(
                    slurm_node_name(name, labels, parsed.node_name_label), name,
                    _address(node)))
        selected = tuple(sorted(chosen, key=lambda n: n.slurm_name))
    return NodesetFacts(
        pool=parsed.pool, name=parsed.pool.split("/", 1)[1],
        registration=spec.registration, conf_server=spec.conf_server, conf=spec.conf,
        partitions=parsed.partitions, grace_seconds=spec.termination_grace_seconds,
        nodes=selected, auth=None if spec.auth is None else spec.auth.type,
        munge_socket_dir=spec.auth.munge_socket_dir
        if spec.auth is not None and spec.auth.type == "munge" and spec.auth.key_secret
        else None)


@dataclass(frozen=True, slots=True)
class SlurmReads:
    """What slurmctld told (None: that read failed, with the reason in `errors`)."""

    config: dict[str, str] | None
    partitions: dict[str, Partition] | None
    nodes: list[str] | None  # every node slurmctld has (slurmrestd's answer)
    errors: tuple[str, ...] = ()


async def read_slurm(nodes: list[str] | None, nodes_error: str | None = None,
                     scontrol: str = "scontrol", env: Mapping[str, str] | None = None
                     ) -> SlurmReads:
    """`scontrol show config` and `scontrol show partition -o`; `nodes` as slurmrestd gave
    them to the doctor (None, with `nodes_error`, when that read failed)."""
    errors = [nodes_error] if nodes is None and nodes_error else []

    async def read(args: list[str], what: str) -> str | None:
        try:
            return await run_scontrol(scontrol, args, what=what, env=env, limit=15)
        except ActionError as error:
            errors.append(str(error))
            return None

    # Both at once: with slurmctld down each waits out scontrol's own retries.
    shown, listed = await asyncio.gather(
        read(["show", "config"], "read slurmctld's configuration"),
        read(["show", "partition", "-o"], "read slurmctld's partitions"))
    config = None if shown is None else parse_show_config(shown)
    partitions = None if listed is None else parse_show_partitions(listed)
    return SlurmReads(config, partitions, nodes, tuple(errors))


def nodesets_report(nodesets: Sequence[Mapping[str, Any]],
                    nodes: Sequence[Mapping[str, Any]] | None, slurm: SlurmReads
                    ) -> dict[str, Any]:
    """The Nodeset checks as the doctor reports them (`--json`'s `nodesets`): per Nodeset
    with `spec.slurmd`, its registration, the Slurm names of its Nodes and every finding.
    `ok` only when every finding of every such Nodeset is ok (an unknown one is not)."""
    entries: list[dict[str, Any]] = []
    for nodeset in nodesets:
        meta = nodeset.get("metadata") or {}
        pool = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        facts = nodeset_facts(nodeset, nodes)
        if facts is None:
            continue
        if isinstance(facts, str):
            entries.append({"nodeset": pool, "ok": False, "malformed": facts,
                            "findings": []})
            continue
        findings = nodeset_findings(facts, config=slurm.config,
                                    partitions=slurm.partitions, slurm_nodes=slurm.nodes)
        entries.append({
            "nodeset": pool, "ok": all(f.ok for f in findings), "malformed": None,
            "registration": facts.registration,
            "nodes": None if facts.nodes is None else [n.slurm_name for n in facts.nodes],
            "findings": [f.as_dict() for f in findings],
        })
    return {"ok": all(e["ok"] for e in entries), "nodesets": entries,
            "read_errors": list(slurm.errors) if entries else []}


def render(report: Mapping[str, Any]) -> list[str]:
    """The table lines: per Nodeset, `ok`, `MISSING` with the slurm.conf lines to add, or
    `UNKNOWN` with what could not be read."""
    if not report["nodesets"]:
        return ["Nodesets with spec.slurmd: none (sunkd runs no slurmd pods)"]
    lines = ["Nodesets with spec.slurmd: what slurm.conf must hold (sunkd never edits it)"]
    for entry in report["nodesets"]:
        if entry["malformed"] is not None:
            lines.append(f"  {entry['nodeset']}: MALFORMED (sunkd acts on none of it): "
                         f"{entry['malformed']}")
            continue
        nodes = entry["nodes"]
        count = "nodes unknown" if nodes is None else f"{len(nodes)} node(s)"
        lines.append(f"  {entry['nodeset']} ({entry['registration']}, {count})")
        for finding in entry["findings"]:
            status = finding["status"]
            label = status if status == "ok" else status.upper()
            head = f"    {label:<8} {finding['check']} = {finding['found']}"
            if status == "ok":
                lines.append(head)
                continue
            lines.append(f"{head}: {finding['why']}")
            for add in (finding["add"] or "").splitlines():
                lines.append(f"               add: {add}")
    for error in report["read_errors"]:
        lines.append(f"  read failed: {error}")
    return lines
