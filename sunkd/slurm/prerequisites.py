"""What a Slurm controller must be configured with before sunkd runs its slurmd in pods
(a Nodeset's `spec.slurmd`), read from `scontrol show config` and said as the slurm.conf
lines to add. sunkd never edits the site's slurm.conf: `sunkd doctor` prints these.

Why each line (slurm.conf(5) and the dynamic-nodes guide of each release):
- `ReturnToService=1` (or 2): a lent node's slurmd pod is deleted, Slurm marks the node
  DOWN/NOT_RESPONDING after `SlurmdTimeout`, and sunkd never sends RESUME; with the default
  0 the node stays DOWN when its slurmd pod registers again on reclaim.
- `SlurmctldParameters=enable_configless`: a slurmd started with `--conf-server` fetches
  its configuration from slurmctld, which serves it only with this option.
- `MaxNodeCount` (dynamic registration, `slurmd -Z`): slurmctld makes room for no more
  nodes than this, and it defaults to the nodes slurm.conf lists; a change needs a
  slurmctld restart ("MaxNodeCount has changed ... slurmctld must be restarted" on
  reconfigure).
- `TreeWidth=65533` (dynamic registration on releases before 23.02): their message
  fan-out cannot place nodes that slurm.conf does not list.
- `GresTypes=gpu`: a node's `Gres=gpu:...` is refused unless the type is declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Registration = Literal["Static", "Dynamic"]

# `Key = Value`, the key padded with spaces; the first line is a header.
_LINE = re.compile(r"^(\w+)\s*=\s?(.*)$")
_NULL = "(null)"


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config` as key -> value (values as printed, `(null)` kept). Lines
    that are not `Key = Value` (the header, plugin sections' titles) are skipped; the
    first value of a key wins (plugin sections repeat some keys)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is not None:
            found.setdefault(match.group(1), match.group(2).strip())
    return found


@dataclass(frozen=True, slots=True)
class Finding:
    """One prerequisite: met or not, what slurmctld reports, and the line to add. `ok`
    None: unknown (what it depends on could not be read), which is never ok."""

    check: str
    ok: bool | None
    found: str
    why: str
    add: str | None = None
    only_for: Registration | None = None

    @property
    def status(self) -> Literal["ok", "missing", "unknown"]:
        return "unknown" if self.ok is None else "ok" if self.ok else "missing"

    def as_dict(self) -> dict[str, object]:
        return {"check": self.check, "ok": self.ok, "status": self.status,
                "found": self.found, "why": self.why,
                # The line to add; nothing when the setting is already there.
                "add": None if self.ok else self.add,
                "only_for": self.only_for}


def _release(config: Mapping[str, str]) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", config.get("SLURM_VERSION", ""))
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _integer(value: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def _parameters(value: str | None) -> list[str]:
    if not value or value == _NULL:
        return []
    return [p.strip() for p in value.split(",") if p.strip()]


def slurmd_prerequisites(config: Mapping[str, str], *, nodes_known: int,
                         nodes_wanted: int = 0, gpus: bool = False
                         ) -> list[Finding]:
    """Every prerequisite, in slurm.conf order of importance. `nodes_known`: the nodes
    slurmctld has now; `nodes_wanted`: dynamic nodes sunkd's Nodesets may add; `gpus`:
    whether a Nodeset gives its nodes GPUs. Findings that matter only for dynamic
    registration say so (`only_for`)."""
    findings: list[Finding] = []
    rts = config.get("ReturnToService", "")
    findings.append(Finding(
        "ReturnToService", _integer(rts) in (1, 2), rts or "unknown",
        "a reclaimed node's slurmd registers again; with 0 Slurm keeps it DOWN, and sunkd "
        "never sends RESUME", "ReturnToService=1"))
    params = _parameters(config.get("SlurmctldParameters"))
    findings.append(Finding(
        "configless", "enable_configless" in params,
        config.get("SlurmctldParameters", "unknown"),
        "slurmd pods fetch slurm.conf from slurmctld (--conf-server)",
        "SlurmctldParameters=" + ",".join([*params, "enable_configless"])))
    most = _integer(config.get("MaxNodeCount"))
    # Room for at least one dynamic node; as many as the Nodesets may add when known,
    # else suggest as many again as slurmctld has.
    needed = nodes_known + max(nodes_wanted, 1)
    findings.append(Finding(
        "MaxNodeCount", most is not None and most >= needed,
        config.get("MaxNodeCount", "unknown"),
        f"room for dynamic nodes beside the {nodes_known} slurmctld has"
        " (a change needs a slurmctld restart)",
        f"MaxNodeCount={nodes_known + (nodes_wanted or max(nodes_known, 1))}",
        only_for="Dynamic"))
    if _release(config) < (23, 2):
        width = _integer(config.get("TreeWidth"))
        findings.append(Finding(
            "TreeWidth", width == 65533, config.get("TreeWidth", "unknown"),
            "dynamic nodes on releases before 23.02 need the flat message fan-out",
            "TreeWidth=65533", only_for="Dynamic"))
    if gpus:
        types = _parameters(config.get("GresTypes"))
        findings.append(Finding(
            "GresTypes", "gpu" in types, config.get("GresTypes", "unknown"),
            "nodes register their GPUs as Gres=gpu:TYPE:N",
            "GresTypes=" + ",".join([*types, "gpu"])))
    return findings


def missing(findings: list[Finding], registration: Registration) -> list[Finding]:
    """The findings not met that matter for `registration`."""
    return [f for f in findings
            if not f.ok and (f.only_for is None or f.only_for == registration)]
