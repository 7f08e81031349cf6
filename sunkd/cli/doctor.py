"""`sunkd doctor`: check the connection to Slurm and show what sunkd sees.

The first thing an operator does after configuring sunkd is to ask "does it see my
cluster the way Slurm does?". This answers with the Slurm release, the negotiated REST
version, the auth mode, whether node updates go through REST or the scontrol fallback,
and a table of normalized nodes (the same model the daemon decides on). For every
Nodeset that runs slurmd pods (`spec.slurmd`) it checks what slurm.conf must hold and
prints the lines to add (`cli/doctor_nodesets.py`). It exits non-zero with a precise
message (auth hint, unreachable URL, malformed field, a missing or unknown slurm.conf
line for such a Nodeset) when something is wrong.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from sunkd.cli.doctor_nodesets import SlurmReads, nodesets_report, read_slurm, render
from sunkd.cli.text import printable
from sunkd.domain.ports import ActionError
from sunkd.runtime.config import Settings
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmAuthError, SlurmError, SlurmNode, SlurmPayloadError
from sunkd.slurm.prerequisites import parse_show_config, slurmd_prerequisites
from sunkd.slurm.scontrol import run_scontrol

__all__ = ["doctor", "slurm_report"]


@dataclass
class SlurmReport:
    url: str
    slurm_release: str | None
    api_version: str
    auth: str
    node_updates: str
    nodes: list[SlurmNode]
    # Every node slurmctld has, whatever `slurm.partitions` shows (MaxNodeCount counts all).
    slurm_nodes: int = 0
    slurm_node_names: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "slurm_release": self.slurm_release,
            "api_version": self.api_version,
            "auth": self.auth,
            "node_updates": self.node_updates,
            "nodes": [
                {
                    "name": n.name,
                    "state": n.state,
                    "display_state": n.display_state,
                    "flags": sorted(n.flags),
                    "reason": n.reason,
                    "reason_set_by": n.reason_set_by,
                    "partitions": list(n.partitions),
                    "cpus": n.cpus,
                    "alloc_cpus": n.alloc_cpus,
                    "gpus_total": n.gpus_total,
                    "gpus_used": n.gpus_used,
                }
                for n in self.nodes
            ],
        }


def _update_path(client: SlurmRestClient) -> str:
    if client.can_update_nodes:
        return f"rest ({client.version} POST node/{{name}})"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return (
            f"unavailable: {client.version} has no REST node update and scontrol is not "
            "installed (read-only)"
        )
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    return f"scontrol ({scontrol}, SLURM_CONF={conf}; {client.version} has no REST node update)"


async def slurm_report(settings: Settings) -> SlurmReport:
    """Negotiate, read all nodes, describe. Raises SlurmError/ValueError on failure."""
    client = SlurmRestClient.from_settings(settings.slurm)
    try:
        await client.negotiate()
        nodes = every_node = await client.get_nodes()
        every = len(nodes)
        partitions = settings.slurm.partitions
        if partitions:
            nodes = [n for n in nodes if any(p in partitions for p in n.partitions)]
        return SlurmReport(
            url=client.url,
            slurm_release=client.slurm_release,
            api_version=client.version,
            auth=client.auth_mode,
            node_updates=_update_path(client),
            nodes=nodes,
            slurm_nodes=every,
            slurm_node_names=tuple(n.name for n in every_node),
        )
    finally:
        await client.close()


async def slurmd_report(node_count: int, scontrol: str = "scontrol",
                        env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What slurmctld still needs before sunkd runs slurmd pods (a Nodeset's
    `spec.slurmd`), from `scontrol show config` (docs/nodeset.md): findings and the
    slurm.conf lines to add. sunkd never edits slurm.conf; without scontrol here the
    check says so and is skipped."""
    try:
        shown = await run_scontrol(scontrol, ["show", "config"],
                                   what="read slurmctld's configuration", env=env, limit=15)
    except ActionError as error:
        return {"checked": False, "error": str(error)}
    findings = slurmd_prerequisites(parse_show_config(shown), nodes_known=node_count)
    return {"checked": True, "findings": [f.as_dict() for f in findings]}


def _slurmd_lines(report: Mapping[str, Any]) -> list[str]:
    lines = ["slurmd pods (Nodeset spec.slurmd): prerequisites in slurmctld"]
    if not report["checked"]:
        return [*lines, f"  not checked: {report['error']}"]
    for finding in report["findings"]:
        scope = f" [{finding['only_for']} registration]" if finding["only_for"] else ""
        if finding["ok"]:
            lines.append(f"  ok       {finding['check']} = {finding['found']}{scope}")
        else:
            lines.append(f"  MISSING  {finding['check']} = {finding['found']}{scope}: "
                         f"add `{finding['add']}` ({finding['why']})")
    return lines


def _table(nodes: list[SlurmNode]) -> list[str]:
    header = ("NODE", "STATE", "FLAGS", "REASON", "PARTITIONS", "CPUS(A/T)", "GPUS(U/T)")
    rows = [
        (
            n.name,
            n.display_state,
            ",".join(sorted(n.flags)) or "-",
            (n.reason or "-") + (f" [{n.reason_set_by}]" if n.reason_set_by else ""),
            ",".join(n.partitions) or "-",
            f"{n.alloc_cpus}/{n.cpus}",
            f"{n.gpus_used}/{n.gpus_total}",
        )
        for n in nodes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


@dataclass
class KubeRead:
    """The API server's answers the doctor reports (`report`) and the objects the Nodeset
    checks read (`nodesets` None: the CRD is not installed)."""

    report: dict[str, Any]
    nodes: list[dict[str, Any]]
    nodesets: list[dict[str, Any]] | None


async def kubernetes_report(settings: Settings) -> KubeRead:
    """Reach the API server with sunkd's own credentials (loaded by kubernetes-asyncio, as
    the daemon loads them): its version, how sunkd authenticates, the nodes sunkd would
    watch, and whether the Nodeset CRD is installed; the Nodes and Nodesets themselves
    for the Nodeset checks."""
    from sunkd.kubernetes.client import NODES, NODESETS, KubeApiError, KubeClient

    kubeconfig = settings.kubernetes.kubeconfig
    client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None,
                                      context=settings.kubernetes.context)
    try:
        version = await client.request("GET", "/version")
        nodes, _ = await client.list(NODES)
        try:
            nodesets: list[dict[str, Any]] | None = list((await client.list(NODESETS))[0])
        except KubeApiError as error:
            if error.status != 404:
                raise
            nodesets = None
        return KubeRead(
            {"server": client.host, "version": (version or {}).get("gitVersion"),
             "auth": client.endpoint.credentials.source,
             "nodes": len(nodes), "nodesets": None if nodesets is None else len(nodesets)},
            list(nodes), nodesets)
    finally:
        await client.close()


async def _nodesets(read: KubeRead, slurm_names: list[str] | None,
                    slurm_error: str | None) -> dict[str, Any]:
    """The checks of every Nodeset with `spec.slurmd` (none: nothing read from Slurm)."""
    if not any((n.get("spec") or {}).get("slurmd") is not None for n in read.nodesets or ()):
        return nodesets_report([], read.nodes, SlurmReads(None, None, None))
    slurm = await read_slurm(slurm_names, slurm_error)
    return nodesets_report(read.nodesets or [], read.nodes, slurm)


async def doctor(settings: Settings, *, as_json: bool, out: TextIO) -> int:
    """Check Slurm and (when enabled) Kubernetes. 0 when everything configured is
    reachable and understood, 1 on any failure, 2 when nothing is configured."""
    result: dict[str, Any] = {}
    failed = False
    lines: list[str] = []
    # What slurmrestd said of the nodes, for the Nodeset checks (None: not read, and why).
    slurm_names: list[str] | None = None
    slurm_error: str | None = "slurm.url is not set"
    if not settings.slurm.url:
        message = "slurm.url is not set: nothing to check (http://host:port or unix:/path)"
        result["slurm"] = {"ok": False, "error": message}
        lines.append(f"slurm: {message}\n")
    else:
        try:
            report = await slurm_report(settings)
        except Exception as error:
            # Whatever slurmrestd (or something pretending to be it) answers, the doctor
            # says what went wrong in a sentence, never with a traceback: a
            # truncated body, a bad status line and JSON nested too deeply are findings.
            kind = (
                "auth"
                if isinstance(error, SlurmAuthError)
                else "bad_payload"
                if isinstance(error, SlurmPayloadError | RecursionError)
                else "error"
            )
            message = str(error) if isinstance(error, SlurmError | ValueError) else \
                f"{type(error).__name__}: {error}"
            if isinstance(error, RecursionError):
                message = "slurmrestd answered JSON nested too deeply to decode"
            failed = True
            slurm_error = f"slurmrestd: {message}"
            result["slurm"] = {"ok": False, "cause": kind, "error": message}
            lines.append(f"slurm: FAILED ({kind}): {message}\n")
        else:
            result["slurm"] = report.as_dict()
            slurm_names, slurm_error = list(report.slurm_node_names), None
            lines.append(
                f"slurm: OK\n"
                f"  url:            {report.url}\n"
                f"  slurm release:  {report.slurm_release or 'unknown'}\n"
                f"  REST version:   {report.api_version}\n"
                f"  auth:           {report.auth} (user {settings.slurm.user})\n"
                f"  node updates:   {report.node_updates}\n"
                f"  nodes:          {len(report.nodes)}\n\n"
            )
            lines.extend(line + "\n" for line in _table(report.nodes))
            slurmd = await slurmd_report(report.slurm_nodes)
            result["slurmd_prerequisites"] = slurmd
            lines.append("\n")
            lines.extend(line + "\n" for line in _slurmd_lines(slurmd))
    if settings.kubernetes.enabled:
        try:
            read = await kubernetes_report(settings)
        except Exception as error:  # config, TLS, auth, network: all are findings here
            failed = True
            result["kubernetes"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            lines.append(f"\nkubernetes: FAILED: {type(error).__name__}: {error}\n")
        else:
            kube = read.report
            result["kubernetes"] = kube
            crd = (f"{kube['nodesets']}" if kube["nodesets"] is not None else
                   "the Nodeset CRD is not installed (kubectl apply -f manifests/crds/)")
            lines.append(f"\nkubernetes: OK\n"
                         f"  server:         {kube['server']} ({kube['version']})\n"
                         f"  auth:           {kube['auth']}\n"
                         f"  nodes:          {kube['nodes']}\n"
                         f"  nodesets:       {crd}\n")
            if read.nodesets is not None:
                checked = await _nodesets(read, slurm_names, slurm_error)
                result["nodesets"] = checked
                failed = failed or not checked["ok"]
                lines.append("\n")
                lines.extend(line + "\n" for line in render(checked))
    configured = bool(settings.slurm.url) or settings.kubernetes.enabled
    if as_json:
        out.write(json.dumps({"ok": configured and not failed and bool(settings.slurm.url),
                              **result}, indent=2) + "\n")
    else:
        # Node reasons and error texts come from outside: escape control characters.
        out.write("\n".join(printable(line) for line in "".join(lines).split("\n")))
    if failed:
        return 1
    return 0 if settings.slurm.url else 2
