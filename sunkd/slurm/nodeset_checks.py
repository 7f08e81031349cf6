"""What slurm.conf must hold for each Nodeset that runs slurmd pods (`spec.slurmd`), checked
against what slurmctld reports, with the exact lines to add. `sunkd doctor` prints them;
sunkd never edits the site's slurm.conf.

`slurm/prerequisites.py` checks the controller as a whole; this module checks it for one
Nodeset: its registration decides which controller settings matter (configless only with
`confServer` or Dynamic registration, `MaxNodeCount`/`TreeWidth` only for Dynamic), and
its partitions must exist in Slurm and hold its nodes. Every check is a pure function of
what was read; what could not be read is `None` and gives an *unknown* finding, never an
ok one (docs/safety.md: unknown is unsafe).

Slurm's rules the lines follow (slurm.conf(5), scontrol(1)):
- a partition's `Nodes=` names nodes or NodeSets, and slurmctld refuses to start when it
  names a node no `NodeName=` line defines ("Invalid node names in partition"), so a
  missing node comes with its `NodeName=` line;
- `NodeSet=NAME Feature=F` selects every node with feature F, dynamic ones included when
  they register with it; `scontrol show partition` lists a partition's NodeSets
  (`NodeSets=`) but not a NodeSet's feature, so that half is said, not checked;
- `KillWait` is how long slurmd waits between SIGTERM and SIGKILL to a job's steps; the
  pod's `terminationGracePeriodSeconds` must leave it that long.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sunkd.domain.hostlist import HostlistError, compress, expand, is_valid_name
from sunkd.slurm.auth_checks import auth_findings
from sunkd.slurm.prerequisites import Finding, slurmd_prerequisites

__all__ = [
    "NodesetFacts",
    "NodesetNode",
    "Partition",
    "check_kill_wait",
    "check_nodes_defined",
    "check_partition",
    "controller_checks",
    "nodeset_findings",
    "parse_show_partitions",
]

_NULL = "(null)"
_TOKEN = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition as `scontrol show partition -o` prints it."""

    name: str
    nodes: tuple[str, ...]  # `Nodes=` expanded (NodeSets' nodes included)
    nodesets: tuple[str, ...] = ()  # `NodeSets=`
    nodes_text: str = ""  # `Nodes=` as printed (a hostlist)


def parse_show_partitions(text: str) -> dict[str, Partition]:
    """`scontrol show partition -o` (one line per partition) as name -> Partition. A line
    without `PartitionName=` is skipped; a `Nodes=` that is not a hostlist keeps its text
    and no names (the membership check then says so rather than guessing)."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = dict(_TOKEN.findall(line))
        name = fields.get("PartitionName")
        if not name:
            continue
        nodes_text = fields.get("Nodes", "")
        nodes_text = "" if nodes_text == _NULL else nodes_text
        try:
            nodes = tuple(expand(nodes_text))
        except HostlistError:
            nodes = ()
        sets = fields.get("NodeSets", "")
        found.setdefault(name, Partition(
            name, nodes, tuple(s for s in sets.split(",") if s and s != _NULL), nodes_text))
    return found


@dataclass(frozen=True, slots=True)
class NodesetNode:
    """A Kubernetes Node the Nodeset selects: its Slurm name and where slurmctld reaches it."""

    slurm_name: str
    kubernetes_name: str
    address: str | None = None  # status.addresses InternalIP; None: not reported


@dataclass(frozen=True, slots=True)
class NodesetFacts:
    """What the checks need of one Nodeset with `spec.slurmd`."""

    pool: str  # "<namespace>/<name>"
    name: str
    registration: str = "Static"
    conf_server: str | None = None
    conf: str | None = None  # spec.slurmd.conf (Dynamic)
    partitions: tuple[str, ...] = ()
    grace_seconds: int = 60  # spec.slurmd.terminationGracePeriodSeconds
    nodes: tuple[NodesetNode, ...] | None = None  # None: the Nodes could not be read
    # spec.slurmd.auth: its type (munge | slurm), None when not given (the site's own
    # way: not checked); the munged sidecar's socket directory when sunkd runs munged.
    auth: str | None = None
    munge_socket_dir: str | None = None


def _unknown(check: str, what: str, why: str) -> Finding:
    return Finding(check, None, f"unknown ({what})", why)


def controller_checks(nodeset: NodesetFacts, config: Mapping[str, str] | None,
                      slurm_nodes: Sequence[str] | None) -> list[Finding]:
    """The controller settings this Nodeset needs: `ReturnToService` always, configless
    with `confServer` or Dynamic registration, `MaxNodeCount` (room for the Nodeset's nodes
    slurmctld does not have yet) and `TreeWidth` for Dynamic. `config` None: `scontrol
    show config` could not be read; `slurm_nodes` None: the node list could not be."""
    dynamic = nodeset.registration == "Dynamic"
    wanted_checks = {"ReturnToService"}
    if nodeset.conf_server or dynamic:
        wanted_checks.add("configless")
    if dynamic:
        wanted_checks |= {"MaxNodeCount", "TreeWidth"}
    if config is None:
        return [_unknown(check, "slurmctld's configuration was not read",
                         "needed for this Nodeset's slurmd pods")
                for check in ("ReturnToService", "configless", "MaxNodeCount")
                if check in wanted_checks]
    known = set(slurm_nodes or ())
    new = [n.slurm_name for n in nodeset.nodes or () if n.slurm_name not in known]
    findings = slurmd_prerequisites(config, nodes_known=len(known),
                                    nodes_wanted=len(new))
    out = []
    for finding in findings:
        if finding.check not in wanted_checks:
            continue
        if finding.check == "MaxNodeCount" and (slurm_nodes is None or nodeset.nodes is None):
            out.append(_unknown("MaxNodeCount", "the node counts were not read",
                                finding.why))
            continue
        out.append(finding)
    return out


def _nodeset_lines(nodeset: NodesetFacts, partition: str, others: Sequence[str]) -> str:
    """A NodeSet of the Nodeset's feature and the partition over it (and what it had)."""
    members = ",".join([*others, nodeset.name])
    return (f"NodeSet={nodeset.name} Feature={nodeset.name}\n"
            f"PartitionName={partition} Nodes={members} State=UP")


def _node_line(node: NodesetNode) -> str:
    where = f"NodeAddr={node.address}" if node.address else \
        f"NodeHostname={node.kubernetes_name}"
    return f"NodeName={node.slurm_name} {where}"


def _hostlist(names: Sequence[str]) -> str:
    if all(is_valid_name(n) for n in names):
        return compress(names, sort=True)
    return ",".join(names)


def check_partition(nodeset: NodesetFacts, partition: str,
                    partitions: Mapping[str, Partition] | None) -> Finding:
    """Partition `partition` of the Nodeset exists and holds its nodes: for Dynamic
    registration through a NodeSet of the Nodeset's name (its nodes do not exist before
    they register); for Static every node the Nodeset selects is in its `Nodes=`."""
    check = f"partition {partition}"
    why = f"jobs for Nodeset {nodeset.pool} run in partition {partition}"
    if partitions is None:
        return _unknown(check, "the partitions were not read", why)
    found = partitions.get(partition)
    dynamic = nodeset.registration == "Dynamic"
    if found is None:
        if dynamic or not nodeset.nodes:
            # No node to name (Dynamic, or no Node selected yet): the NodeSet form.
            return Finding(check, False, "absent", why + (
                f"; give the NodeSet's nodes Feature={nodeset.name}" if not dynamic else ""),
                _nodeset_lines(nodeset, partition, ()))
        names = [n.slurm_name for n in nodeset.nodes]
        return Finding(check, False, "absent", why,
                       f"PartitionName={partition} Nodes={_hostlist(names)} State=UP")
    printed = found.nodes_text or "(none)"
    if found.nodesets:
        printed += f" NodeSets={','.join(found.nodesets)}"
    if dynamic:
        if nodeset.name in found.nodesets:
            return Finding(check, True, printed, why + f" (NodeSet {nodeset.name}: its "
                           f"Feature= is not shown by slurmctld; it must be {nodeset.name})")
        # What it has stays: its NodeSets, or (none) the nodes it names.
        had = list(found.nodesets) or ([found.nodes_text] if found.nodes_text else [])
        return Finding(check, False, printed, why + "; dynamic nodes join it through a "
                       "NodeSet", _nodeset_lines(nodeset, partition, had))
    if nodeset.nodes is None:
        return _unknown(check, "the Nodeset's Kubernetes Nodes were not read", why)
    if found.nodes_text and not found.nodes:
        return _unknown(check, f"its Nodes={found.nodes_text} is not a hostlist sunkd reads",
                        why)
    absent = [n.slurm_name for n in nodeset.nodes if n.slurm_name not in found.nodes]
    if not absent:
        return Finding(check, True, printed, why)
    members = [*found.nodesets, _hostlist([*found.nodes, *absent])]
    return Finding(check, False, f"{printed} (without {_hostlist(absent)})", why,
                   f"PartitionName={partition} Nodes={','.join(members)} State=UP")


def check_nodes_defined(nodeset: NodesetFacts, slurm_nodes: Sequence[str] | None
                        ) -> Finding | None:
    """Static registration: every node the Nodeset selects has a `NodeName=` line
    (slurmd -N NAME registers only as a node slurm.conf defines). None for Dynamic."""
    if nodeset.registration == "Dynamic":
        return None
    why = ("slurmd -N registers only a node slurm.conf defines; give it the host's "
           "CPUs=, RealMemory= and Gres= too")
    if slurm_nodes is None or nodeset.nodes is None:
        return _unknown("NodeName lines", "Slurm's or Kubernetes' nodes were not read", why)
    known = set(slurm_nodes)
    absent = [n for n in nodeset.nodes if n.slurm_name not in known]
    if not absent:
        return Finding("NodeName lines", True, f"{len(nodeset.nodes)} of "
                       f"{len(nodeset.nodes)} defined", why)
    return Finding("NodeName lines", False,
                   f"{len(absent)} of {len(nodeset.nodes)} not in Slurm", why,
                   "\n".join(_node_line(n) for n in absent))


def _seconds(value: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def check_kill_wait(nodeset: NodesetFacts, config: Mapping[str, str] | None) -> Finding:
    """`KillWait` (printed `30 sec`) fits in the pod's grace period."""
    check = "KillWait"
    why = (f"a job step gets KillWait between SIGTERM and SIGKILL; the slurmd pod's grace "
           f"is {nodeset.grace_seconds} s (or raise spec.slurmd.terminationGracePeriodSeconds)")
    if config is None:
        return _unknown(check, "slurmctld's configuration was not read", why)
    text = config.get("KillWait")
    seconds = _seconds(text)
    if seconds is None:
        return _unknown(check, f"KillWait = {text or 'absent'}", why)
    return Finding(check, seconds <= nodeset.grace_seconds, text or "",
                   why, None if seconds <= nodeset.grace_seconds
                   else f"KillWait={nodeset.grace_seconds}")


def check_conf_port(nodeset: NodesetFacts, config: Mapping[str, str] | None
                    ) -> Finding | None:
    """A Dynamic Nodeset's `conf` with `Port=`: slurmd before 23.11 refuses it and exits
    (`fatal: option 'Port=' not allowed in --conf`; `_validate_dynamic_conf` in
    src/slurmd/slurmd/slurmd.c matches the text anywhere in --conf, case-insensitively).
    None when there is none (or Static)."""
    if nodeset.registration != "Dynamic" or "port=" not in (nodeset.conf or "").lower():
        return None
    check = "conf Port="
    why = ("slurmd refuses Port= in --conf before 23.11: remove it from spec.slurmd.conf "
           "(SlurmdPort applies)")
    version = (config or {}).get("SLURM_VERSION", "")
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return _unknown(check, "the Slurm version was not read", why)
    ok = (int(match.group(1)), int(match.group(2))) >= (23, 11)
    return Finding(check, ok, f"Slurm {version}", why)


def nodeset_findings(nodeset: NodesetFacts, *, config: Mapping[str, str] | None,
                     partitions: Mapping[str, Partition] | None,
                     slurm_nodes: Sequence[str] | None) -> list[Finding]:
    """Every check for one Nodeset, in the order a site fixes them."""
    findings = controller_checks(nodeset, config, slurm_nodes)
    findings.append(check_kill_wait(nodeset, config))
    port = check_conf_port(nodeset, config)
    if port is not None:
        findings.append(port)
    defined = check_nodes_defined(nodeset, slurm_nodes)
    if defined is not None:
        findings.append(defined)
    findings.extend(check_partition(nodeset, p, partitions) for p in nodeset.partitions)
    if nodeset.auth is not None:
        findings.extend(auth_findings(nodeset.auth, config,
                                      munge_socket_dir=nodeset.munge_socket_dir))
    return findings
