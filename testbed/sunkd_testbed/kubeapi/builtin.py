"""The built-in resource types served by the emulator, with their printer columns.

Column sets mirror `k8s.io/kubernetes/pkg/printers/internalversion/printers.go`
(printNode, printPod, printNamespace, printEvent, printLease, printPodDisruptionBudget,
and the CRD printer of apiextensions-apiserver).
"""

from __future__ import annotations

from typing import Any

from .resources import (
    EVENT_FIELDS,
    JSON,
    NAMESPACE_FIELDS,
    NODE_FIELDS,
    NODE_MERGE_KEYS,
    PDB_MERGE_KEYS,
    POD_FIELDS,
    POD_MERGE_KEYS,
    Column,
    ResourceType,
    event_fields,
    namespace_fields,
    node_fields,
    pod_fields,
)
from .tables import age, age_column, parse_time


def _conditions(obj: JSON) -> list[JSON]:
    return [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]


def node_status(obj: JSON) -> str:
    # printers.go printNode: condition statuses, then SchedulingDisabled when cordoned.
    states = []
    for cond in _conditions(obj):
        if cond.get("type") == "Ready":
            states.append("Ready" if cond.get("status") == "True" else
                          "NotReady" if cond.get("status") == "False" else "Unknown")
    if not states:
        states.append("Unknown")
    if (obj.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    return ",".join(states)


def node_roles(obj: JSON) -> str:
    roles = set()
    for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/"):
            roles.add(key.split("/", 1)[1])
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(r for r in roles if r)) or "<none>"


def _address(obj: JSON, kind: str) -> str:
    for addr in (obj.get("status") or {}).get("addresses") or []:
        if addr.get("type") == kind:
            return str(addr.get("address"))
    return "<none>"


def _node_info(obj: JSON, key: str) -> str:
    return str(((obj.get("status") or {}).get("nodeInfo") or {}).get(key) or "<unknown>")


def pod_ready(obj: JSON) -> str:
    spec_containers = (obj.get("spec") or {}).get("containers") or []
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len(spec_containers)}"


def pod_status(obj: JSON) -> str:
    status = obj.get("status") or {}
    reason = str(status.get("reason") or status.get("phase") or "Unknown")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = str(waiting["reason"])
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def pod_restarts(obj: JSON) -> int:
    return sum(int(cs.get("restartCount", 0)) for cs in
               (obj.get("status") or {}).get("containerStatuses") or [])


def _event_object(obj: JSON) -> str:
    inv = obj.get("involvedObject") or {}
    return f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}"


def _event_last_seen(obj: JSON) -> str:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        if obj.get(key):
            return age(obj.get(key))
    return age((obj.get("metadata") or {}).get("creationTimestamp"))


def _pdb_value(obj: JSON, key: str) -> Any:
    value = (obj.get("spec") or {}).get(key)
    return "N/A" if value is None else str(value)


def _s(path: list[str]) -> Any:
    def get(obj: JSON) -> Any:
        node: Any = obj
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node
    return get


def make_builtins() -> list[ResourceType]:
    ns_column = Column("Status", "string", "The status of the namespace",
                       value=lambda o: (o.get("status") or {}).get("phase", ""))
    nodes = ResourceType(
        group="", version="v1", plural="nodes", kind="Node", namespaced=False,
        singular="node", short_names=["no"], status_subresource=True,
        fields=node_fields, field_names=NODE_FIELDS, merge_keys=NODE_MERGE_KEYS,
        columns=[
            Column("Status", "string", "The status of the node", value=node_status),
            Column("Roles", "string", "The roles of the node", value=node_roles),
            age_column(),
            Column("Version", "string", "Kubelet Version reported by the node.",
                   value=lambda o: _node_info(o, "kubeletVersion")),
            Column("Internal-IP", "string", "List of internal IPs for the node.", 1,
                   value=lambda o: _address(o, "InternalIP")),
            Column("External-IP", "string", "List of external IPs for the node.", 1,
                   value=lambda o: _address(o, "ExternalIP")),
            Column("OS-Image", "string", "OS Image reported by the node.", 1,
                   value=lambda o: _node_info(o, "osImage")),
            Column("Kernel-Version", "string", "Kernel Version reported by the node.", 1,
                   value=lambda o: _node_info(o, "kernelVersion")),
            Column("Container-Runtime", "string", "Container Runtime Version reported by "
                   "the node.", 1, value=lambda o: _node_info(o, "containerRuntimeVersion")),
        ],
    )
    pods = ResourceType(
        group="", version="v1", plural="pods", kind="Pod", namespaced=True, singular="pod",
        short_names=["po"], categories=["all"], status_subresource=True,
        status_reset_on_create=True, fields=pod_fields, field_names=POD_FIELDS,
        merge_keys=POD_MERGE_KEYS,
        extra_subresources={"eviction": ("policy", "v1", "Eviction")},
        columns=[
            Column("Ready", "string", "The aggregate readiness state of this pod for "
                   "accepting traffic.", value=pod_ready),
            Column("Status", "string", "The aggregate status of the containers in this pod.",
                   value=pod_status),
            Column("Restarts", "string", "The number of times the containers in this pod "
                   "have been restarted and when the last container in this pod has "
                   "restarted.", value=lambda o: str(pod_restarts(o))),
            age_column(),
            Column("IP", "string", "IP address allocated to the pod.", 1,
                   value=lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
            Column("Node", "string", "Name of the node where the pod is scheduled.", 1,
                   value=lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
            Column("Nominated Node", "string", "Name of the node where the pod is "
                   "nominated.", 1,
                   value=lambda o: (o.get("status") or {}).get("nominatedNodeName")
                   or "<none>"),
            Column("Readiness Gates", "string", "Pod readiness gates.", 1,
                   value=lambda o: "<none>"),
        ],
    )
    namespaces = ResourceType(
        group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False,
        singular="namespace", short_names=["ns"], status_subresource=True,
        fields=namespace_fields, field_names=NAMESPACE_FIELDS,
        merge_keys={("spec", "finalizers"): None},
        columns=[ns_column, age_column()],
    )
    events = ResourceType(
        group="", version="v1", plural="events", kind="Event", namespaced=True,
        singular="event", short_names=["ev"], fields=event_fields, field_names=EVENT_FIELDS,
        name_column=False,
        columns=[
            Column("Last Seen", "string", "Time since the most recent occurrence",
                   value=_event_last_seen),
            Column("Type", "string", "Type of this event", value=_s(["type"])),
            Column("Reason", "string", "Reason of this event", value=_s(["reason"])),
            Column("Object", "string", "The object this event is about",
                   value=_event_object),
            Column("Subobject", "string", "Subobject of the event", 1,
                   value=lambda o: (o.get("involvedObject") or {}).get("fieldPath", "")),
            Column("Source", "string", "The source of this event", 1,
                   value=lambda o: (o.get("source") or {}).get("component", "")),
            Column("Message", "string", "Message of this event", value=_s(["message"])),
            Column("First Seen", "string", "Time since first occurrence", 1,
                   value=lambda o: age(o.get("firstTimestamp"))),
            Column("Count", "string", "Number of occurrences", 1,
                   value=lambda o: str(o.get("count", 1))),
            Column("Name", "string", "Name of this event", 1,
                   value=lambda o: (o.get("metadata") or {}).get("name", "")),
        ],
    )
    pdbs = ResourceType(
        group="policy", version="v1", plural="poddisruptionbudgets",
        kind="PodDisruptionBudget", namespaced=True, singular="poddisruptionbudget",
        short_names=["pdb"], status_subresource=True, tracks_generation=True,
        status_reset_on_create=True, merge_keys=PDB_MERGE_KEYS,
        columns=[
            Column("Min Available", "string", "The minimum number of pods that must be "
                   "available", value=lambda o: _pdb_value(o, "minAvailable")),
            Column("Max Unavailable", "string", "The maximum number of pods that may be "
                   "unavailable", value=lambda o: _pdb_value(o, "maxUnavailable")),
            Column("Allowed Disruptions", "integer", "Calculated number of pods that may be "
                   "disrupted at this time",
                   value=lambda o: int((o.get("status") or {}).get("disruptionsAllowed", 0))),
            age_column(),
        ],
    )
    leases = ResourceType(
        group="coordination.k8s.io", version="v1", plural="leases", kind="Lease",
        namespaced=True, singular="lease",
        columns=[
            Column("Holder", "string", "The holder of the lease",
                   value=lambda o: (o.get("spec") or {}).get("holderIdentity") or ""),
            age_column(),
        ],
    )

    def crd_created(o: JSON) -> str:
        when = parse_time((o.get("metadata") or {}).get("creationTimestamp"))
        return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else ""

    crds = ResourceType(
        group="apiextensions.k8s.io", version="v1", plural="customresourcedefinitions",
        kind="CustomResourceDefinition", namespaced=False,
        singular="customresourcedefinition", short_names=["crd", "crds"],
        categories=["api-extensions"], status_subresource=True, tracks_generation=True,
        status_reset_on_create=True,
        columns=[Column("Created At", "date", "", value=crd_created)],
    )
    return [namespaces, nodes, pods, events, pdbs, leases, crds]
