"""Domain events: the only vocabulary the event log speaks.

Everything sunkd observes, decides or does becomes one of these immutable, versioned
payloads (docs/architecture.md). Adapters translate raw Slurm and Kubernetes JSON
into them at the edge, so the fold and the policy never see wire formats.

Forward compatibility is a safety property here: an older sunkd reading a log written
by a newer one must neither crash nor drop what it does not understand, because the
log is the system of record. Unknown kinds decode to `UnknownPayload` and unknown
fields of known kinds are kept in `extra`; both re-encode byte-for-byte equivalently.

Payloads stay plain frozen dataclasses that mypy checks; their JSON codec is
`sunkd.domain.codec`. This module is the catalogue of every event kind, read as a list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

# The version key inside every stored payload. Kept short: it is in every row.
VERSION_KEY = "v"


class EventDecodeError(ValueError):
    """A stored payload cannot be decoded: a known field has the wrong type."""


@dataclass(frozen=True, slots=True)
class Payload:
    """Base of every typed payload. `extra` keeps fields written by a newer sunkd."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    extra: Mapping[str, Any] = field(default_factory=dict, compare=True, kw_only=True)

    @property
    def kind(self) -> str:
        return self.KIND


@dataclass(frozen=True, slots=True)
class UnknownPayload(Payload):
    """A payload of a kind this sunkd does not know, passed through untouched."""

    unknown_kind: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.unknown_kind


# --------------------------------------------------------------------------- nested


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class Label:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class NodeJobEnd:
    """When the jobs running on a Slurm node are expected to end (max end time).

    Only in logs written before job ends moved to `slurm.node.observed`:
    `legacy_node_job_ends` decodes it from an old `slurm.demand.observed` row."""

    node: str
    expected_end: float | None  # unix seconds; None = unlimited / unknown
    jobs: int = 0


@dataclass(frozen=True, slots=True)
class ConfiguredPool:
    """What decides a config-file pool's membership (its knobs stay in the config)."""

    name: str
    partitions: tuple[str, ...] = ()
    node_selector: tuple[Label, ...] = ()
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PodRef:
    # Written to the log only when not at their default (`codec`): most pods are no slurmd
    # pod, and every workload report lists every pod of its Node.
    OMIT_DEFAULTS: ClassVar[tuple[str, ...]] = (
        "slurmd", "slurmd_nodeset", "deleting", "started_at", "slurmd_busy",
        "slurmd_revision")

    namespace: str
    name: str
    phase: str = "Pending"
    uid: str = ""  # metadata.uid: evictions are preconditioned on it (a re-created pod differs)
    pool_pod: bool = True  # matches the pool's workload selector; False: any other pod there
    # The Slurm node this pod is sunkd's slurmd pod for (Nodeset spec.slurmd): its
    # controller owner reference names a Nodeset the source knows, by uid, and its labels
    # name that Nodeset and the node. "" for every other pod, an impostor with the labels
    # included. Judged by the Kubernetes source (kubernetes/source.py).
    slurmd: str = ""
    # The uid of the Nodeset that owns it (with `slurmd`): two Nodesets may name the same
    # Slurm node, and one's pod is foreign to the other's plan.
    slurmd_nodeset: str = ""
    deleting: bool = False  # metadata.deletionTimestamp is set: terminating
    # When the slurmd container last started, while the pod is Ready (its
    # state.running.startedAt: the node's clock), for slurmd pods only (the plan's
    # registration bound, and whose slurmd Slurm hears: `slurmdgone.heard_since`); None
    # otherwise.
    started_at: float | None = None
    # sunkd's busy label (wellknown.LABEL_SLURMD_BUSY) is on it; slurmd pods only (with
    # `slurmd`): the label the PodDisruptionBudget selects (policy/slurmdbusy.py).
    slurmd_busy: bool = False
    # A slurmd pod's `sunkd.io/slurmd-revision` annotation (the hash of the spec it was
    # created from, `policy/slurmd.py` `revision`), for slurmd pods only; "" otherwise or
    # when the pod carries none. An outdated pod is replaced by the rolling update
    # (`policy/slurmdupdate.py`).
    slurmd_revision: str = ""


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    cpu_millis: int = 0
    memory_bytes: int = 0
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class OwnershipSpec:
    """Per-pool ownership knobs (Nodeset spec.ownership or a config-file pool)."""

    mode: str = "Auto"  # Auto | Slurm | Kubernetes
    min_slurm: int = 0
    min_kubernetes: int = 0
    max_kubernetes: int | None = None
    prefer: str = "Slurm"  # Slurm | Kubernetes
    dwell_seconds: float = 300.0
    max_in_flight: int = 1
    drain_timeout_seconds: float = 1800.0
    reclaim_grace_seconds: float = 300.0
    # Lend ahead of the pool's forecast demand (domain/forecast.py, policy/ahead.py):
    # on/off, how far ahead at most (the lead time is what the pool's lends took), and
    # the quantile of an hour's past peaks to hold nodes for.
    forecast: bool = False
    forecast_horizon_seconds: float = 4 * 3600.0
    headroom_quantile: float = 0.9
    # Daily blocks behind the forecast (policy/blocks.py): the shortest trough, in hours,
    # the pool lends to Slurm in one block and takes back once ahead of the rise (0: off).
    forecast_block_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class SlurmdAuth:
    """Nodeset `spec.slurmd.auth` (docs/nodeset.md, "Authentication"): how the slurmd pod
    authenticates to Slurm. `munge` with `key_secret`: the pod runs its own munged beside
    slurmd, keyed from the Secret; `munge` without: the site provides munged's socket (its
    own volumes). `slurm`: auth/slurm (Slurm 23.11+), the Secret's key given to slurmd."""

    type: str = "munge"  # munge | slurm (slurm.conf AuthType=auth/<type>)
    key_secret: str = ""  # the Secret's name; "" = none (munge only)
    key_secret_key: str = ""  # the key inside it (munge.key / slurm.key by default)
    munge_image: str | None = None  # munged's image; None = the slurmd image
    munge_socket_dir: str = "/run/munge"  # where munged puts munge.socket.2 (AuthInfo)


@dataclass(frozen=True, slots=True)
class SlurmdSpec:
    """Nodeset `spec.slurmd`: the slurmd pod sunkd runs on each Slurm-owned node of the pool
    (docs/nodeset.md). Absent on a Nodeset: sunkd runs no pods (the site runs slurmd).

    Volumes and mounts are Kubernetes objects kept as canonical JSON text (the codec holds
    primitives and dataclasses only); `kubernetes/normalize.py` checked their shape."""

    # Written to the log only when set (`codec`): events before them lack them.
    OMIT_DEFAULTS: ClassVar[tuple[str, ...]] = ("template", "auth")

    image: str = ""
    image_pull_policy: str = "IfNotPresent"
    registration: str = "Static"  # Static: `slurmd -D -N <node>`; Dynamic: `-Z`, `--conf`
    conf_server: str | None = None  # `--conf-server host[:port]` (configless)
    conf: str | None = None  # `--conf "..."`: Dynamic registration only (Slurm's rule)
    args: tuple[str, ...] = ()  # further slurmd arguments, appended as given
    env: tuple[Label, ...] = ()
    requests: tuple[Label, ...] = ()  # resources.requests: name -> quantity text
    limits: tuple[Label, ...] = ()
    volumes: tuple[str, ...] = ()  # JSON of core/v1 Volume
    volume_mounts: tuple[str, ...] = ()  # JSON of core/v1 VolumeMount
    privileged: bool = True  # slurmd manages cgroups for job steps
    priority_class_name: str = "system-node-critical"
    termination_grace_seconds: int = 60  # at least Slurm's KillWait (30 s by default)
    # RollingUpdate: outdated pods replaced under a drain, `max_unavailable` nodes at a
    # time (policy/slurmdupdate.py); OnDelete: only a pod that is gone comes back new.
    update_strategy: str = "RollingUpdate"
    max_unavailable: str = "1"  # an integer or a percentage ("25%")
    max_concurrent_startup: int | None = None  # None: no bound
    # `template`: a partial PodTemplateSpec merged onto the pod (kubernetes/slurmd_template.py),
    # canonical JSON text; None: none. Left out of the log and the revision when None, so a
    # spec without one keeps its revision (no pod is replaced by an upgrade of sunkd).
    template: str | None = None
    # How slurmd authenticates (SlurmdAuth); None: `auth` not given, the site's own way
    # (written to the log only when set, so a spec without it keeps its revision).
    auth: SlurmdAuth | None = None


@dataclass(frozen=True, slots=True)
class TopologyChoice:
    """A Nodeset's `spec.topology` (docs/topology.md): the labels Slurm's topology is
    rendered from. `error` says why it cannot be used (the rest of the Nodeset still
    counts): the topology is then not delivered, and the condition says so."""

    kind: str = "tree"  # tree | block
    preset: str | None = None
    levels: tuple[str, ...] = ()
    block_label: str | None = None
    block_sizes: tuple[int, ...] = ()
    error: str | None = None


# ---------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class SlurmNodeObserved(Payload):
    KIND: ClassVar[str] = "slurm.node.observed"
    # Written to the log only when set (`codec`): events before it lack it.
    OMIT_DEFAULTS: ClassVar[tuple[str, ...]] = ("slurmd_start_time",)
    node: str = ""
    state: str = "unknown"  # base state, upper case: IDLE ALLOCATED MIXED DOWN FUTURE UNKNOWN ...
    flags: tuple[str, ...] = ()  # sorted, upper case: DRAIN NOT_RESPONDING COMPLETING ...
    reason: str | None = None
    reason_set_by: str | None = None
    reason_time: float | None = None
    cpus: int = 0
    alloc_cpus: int = 0
    gpus_total: int = 0
    gpus_used: int = 0
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    comment: str | None = None
    boot_time: float | None = None
    last_busy: float | None = None
    # The running jobs on the node (any partition) and the latest of their expected ends
    # (unix seconds; None with jobs > 0 = unlimited or unknown). Per node, so an event's
    # size never grows with the number of busy nodes; the source emits a change of
    # `job_end` only beyond `JOB_END_TOLERANCE_SECONDS` (sunkd/slurm/source.py).
    jobs: int = 0
    job_end: float | None = None
    # The node's configured GRES as Slurm reports it (`gpu:a100:8(S:0-1)`); None when the
    # answer had none. Compared with what Kubernetes says the node has (K8sNodeObserved.gres).
    gres: str | None = None
    # When the slurmd slurmctld last heard registering started (unix seconds, the slurmd
    # host's clock; `slurmd_start_time` of slurmrestd's node); None when not reported.
    # A slurmd pod counts as registered only when this is not before its container
    # started (`slurmdgone.slurmd_registered`): slurmctld keeps reporting a node in contact
    # from its previous slurmd until its next ping.
    slurmd_start_time: float | None = None


@dataclass(frozen=True, slots=True)
class SlurmNodeVanished(Payload):
    KIND: ClassVar[str] = "slurm.node.vanished"
    node: str = ""


@dataclass(frozen=True, slots=True)
class SlurmDemandObserved(Payload):
    """Per partition: what pending jobs wait for, and how many jobs run (counters only).

    Rows written before job ends moved into node observations also carried
    `node_job_ends` (every busy node's expected job end): such a row decodes with it in
    `extra`, re-encodes unchanged, and still means what it meant (`legacy_node_job_ends`,
    read by the policy's `job_ends`)."""

    KIND: ClassVar[str] = "slurm.demand.observed"
    partition: str = ""
    pending_jobs: int = 0
    pending_nodes: int = 0  # nodes needed by jobs pending for resources
    running_jobs: int = 0
    # Nodes the job Slurm schedules next needs: the widest pending job whose reason is
    # `Resources` (Slurm gives that reason to the highest-priority job waiting for nodes;
    # the others show `Priority`). 0: not reported (older sunkd) or no such job. The
    # policy's fairness bounds read it (policy/fairness.py).
    head_nodes: int = 0
    head_job: int = 0  # that job's id (0: not reported); its wait is folded from here


@dataclass(frozen=True, slots=True)
class K8sNodeObserved(Payload):
    KIND: ClassVar[str] = "k8s.node.observed"
    node: str = ""  # Kubernetes node name
    slurm_node: str = ""  # the Slurm node name (label sunkd.io/slurm-node-name, else node)
    ready: bool | None = None  # Ready condition; None when absent/Unknown
    unschedulable: bool = False
    # Informational only: the Node carries sunkd's hold taint (sunkd.io/slurm-hold). Never
    # proof that sunkd made it (domain/authorship.py decides that). Rows written before the
    # rename carry it under its former key ("cordoned" where it now says "held"), kept in
    # `extra` as any unknown field is.
    held_by_sunkd: bool = False
    taints: tuple[Taint, ...] = ()
    labels: tuple[Label, ...] = ()  # pool-relevant labels only
    pin: str | None = None  # annotation sunkd.io/pin: slurm | kubernetes | auto
    cpu_millis: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    # The allocatable resources (`cpu`, `memory`, the GPU resource) whose quantity did not
    # parse (malformed, NaN, negative, out of range): unknown, whatever the field above says.
    unparsed: tuple[str, ...] = ()
    # The GRES Slurm must report for this node, from its GPUs (sunkd/domain/gres.py:
    # `gpu:TYPE:N`, "" for none, `unknown: why` when the count cannot be read). None: the
    # GRES check is off.
    gres: str | None = None


@dataclass(frozen=True, slots=True)
class K8sNodeVanished(Payload):
    KIND: ClassVar[str] = "k8s.node.vanished"
    node: str = ""


@dataclass(frozen=True, slots=True)
class K8sWorkloadObserved(Payload):
    """Per Kubernetes Node (`node`): every pod bound there except DaemonSet and mirror
    pods, whatever it serves; each report replaces the Node's whole list. Every Node is
    reported, in a pool or not. `pool` is empty; logs written before per-Node reports
    named the Node's Nodeset pool (their lists were already the Node's whole list)."""

    KIND: ClassVar[str] = "k8s.workload.observed"
    node: str = ""
    pool: str = ""
    pods: tuple[PodRef, ...] = ()
    # False: the source could not record the Node's pods (the log refused its report):
    # they are unknown until a complete report, never "none".
    complete: bool = True


@dataclass(frozen=True, slots=True)
class K8sDemandObserved(Payload):
    """Per pool: pending, unschedulable pool pods and what they ask for."""

    KIND: ClassVar[str] = "k8s.demand.observed"
    pool: str = ""
    pending: tuple[PendingPod, ...] = ()


@dataclass(frozen=True, slots=True)
class K8sNodesetObserved(Payload):
    KIND: ClassVar[str] = "k8s.nodeset.observed"
    # Written to the log only when set (`codec`): events before them lack them.
    OMIT_DEFAULTS: ClassVar[tuple[str, ...]] = ("deleting", "slurmd_finalizer")
    pool: str = ""  # "<namespace>/<name>"
    generation: int = 0
    node_selector: tuple[Label, ...] = ()
    partitions: tuple[str, ...] = ()
    node_name_label: str | None = None
    workload_selector: tuple[Label, ...] = ()
    ownership: OwnershipSpec = field(default_factory=OwnershipSpec)
    deleted: bool = False
    uid: str = ""  # metadata.uid: the owner reference of the slurmd pods names it
    slurmd: SlurmdSpec | None = None  # spec.slurmd; None: sunkd runs no slurmd pods
    topology: TopologyChoice | None = None  # spec.topology; None: the config's default
    # metadata.deletionTimestamp is set (the Nodeset is Terminating), and sunkd's finalizer
    # (wellknown.FINALIZER_SLURMD_PODS) is in metadata.finalizers: policy/slurmdfinalizer.py.
    deleting: bool = False
    slurmd_finalizer: bool = False


@dataclass(frozen=True, slots=True)
class SourceHealth(Payload):
    KIND: ClassVar[str] = "source.health"
    source: str = ""  # "slurm" | "kubernetes"
    status: str = "fresh"  # fresh | stale | lost
    cause: str | None = None  # auth | timeout | controller_down | bad_payload | ...
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class SlurmHookReceived(Payload):
    """A Slurm hook (`sunkd hook`, run by slurmctld or slurmd) told sunkd about a job.

    A hint, never an observation: the fold ignores it. What sunkd then read from
    slurmrestd is logged as ordinary `slurm.node.observed` events in the same batch; this
    record says which hook caused that read and how long it took (docs/slurm.md, "Hooks").
    `sent_at` is the hook's clock; `read_seconds` from receipt to the read's answer."""

    KIND: ClassVar[str] = "slurm.hook"
    event: str = ""  # prolog-slurmctld | epilog-slurmctld | epilog
    job_id: int = 0
    nodes: str = ""  # the hostlist Slurm gave the hook (bounded by the API)
    partition: str = ""
    sent_at: float | None = None
    received_at: float = 0.0
    read_seconds: float = 0.0
    changed: int = 0  # observations the read appended with this record


# -------------------------------------------------------------------------- operator


@dataclass(frozen=True, slots=True)
class OperatorPinned(Payload):
    KIND: ClassVar[str] = "operator.pinned"
    node: str = ""
    to: str = "auto"  # slurm | kubernetes | auto
    who: str = ""
    why: str = ""


# ------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class TransitionStarted(Payload):
    KIND: ClassVar[str] = "transition.started"
    transition_id: str = ""
    node: str = ""
    pool: str = ""
    from_owner: str = ""  # slurm | kubernetes
    to_owner: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TransitionCompleted(Payload):
    KIND: ClassVar[str] = "transition.completed"
    transition_id: str = ""
    node: str = ""
    pool: str = ""
    from_owner: str = ""
    to_owner: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TransitionAborted(Payload):
    KIND: ClassVar[str] = "transition.aborted"
    transition_id: str = ""
    node: str = ""
    pool: str = ""
    from_owner: str = ""
    to_owner: str = ""
    reason: str = ""


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class ActionRequested(Payload):
    KIND: ClassVar[str] = "action.requested"
    action_id: str = ""
    transition_id: str | None = None
    side: str = ""  # slurm | kubernetes
    verb: str = ""  # drain resume lock unlock cordon (hold) uncordon (release) evict ...
    node: str = ""
    attempt: int = 1
    reason: str = ""
    args: tuple[Label, ...] = ()  # verb-specific string arguments


@dataclass(frozen=True, slots=True)
class ActionSucceeded(Payload):
    KIND: ClassVar[str] = "action.succeeded"
    action_id: str = ""
    transition_id: str | None = None
    side: str = ""
    verb: str = ""
    node: str = ""
    attempt: int = 1
    changed: bool = True  # False when the action found the world already as wanted


@dataclass(frozen=True, slots=True)
class ActionFailed(Payload):
    KIND: ClassVar[str] = "action.failed"
    action_id: str = ""
    transition_id: str | None = None
    side: str = ""
    verb: str = ""
    node: str = ""
    attempt: int = 1
    error: str = ""
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class NodeForgotten(Payload):
    """The policy forgets a node gone from both Slurm and Kubernetes for a while: its
    NodeState and name mappings leave the fold, so memory follows the live cluster."""

    KIND: ClassVar[str] = "node.forgotten"
    node: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PoolsConfigured(Payload):
    """The config-file pools the leader runs with, recorded when they differ from the
    log's (a term's start, a SIGHUP reload): with the Nodesets already in the log, the
    fold then knows every pool and keeps full state only for the nodes a pool, a pin or
    sunkd's own history names (docs/architecture.md, "Bounded state")."""

    KIND: ClassVar[str] = "pools.configured"
    pools: tuple[ConfiguredPool, ...] = ()


# ------------------------------------------------------------------------ leadership


@dataclass(frozen=True, slots=True)
class LeaderElected(Payload):
    KIND: ClassVar[str] = "leader.elected"
    epoch: int = 0
    identity: str = ""


# ------------------------------------------------------------------------ retention


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One file of an archive: events from_seq..upto_seq, gzip JSON lines."""

    name: str
    from_seq: int
    upto_seq: int
    events: int
    sha256: str  # of the file's bytes as written (compressed)


@dataclass(frozen=True, slots=True)
class LogArchived(Payload):
    """`sunkd log archive` wrote events from_seq..upto_seq to files (checksummed, listed
    in `manifest`) and is about to remove them from the database; the snapshot at
    `base_seq` (= upto_seq) is the new base a replay starts from. `origin_*` identify
    the log's first event (seq 1), which may be archived by now (docs/operations.md)."""

    KIND: ClassVar[str] = "log.archived"
    from_seq: int = 0
    upto_seq: int = 0
    events: int = 0
    base_seq: int = 0
    location: str = ""
    manifest: str = ""
    manifest_sha256: str = ""
    files: tuple[ArchiveFile, ...] = ()
    origin_recorded_at: str = ""
    origin_kind: str = ""
    origin_subject: str = ""


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    cls.KIND: cls
    for cls in (
        SlurmNodeObserved,
        SlurmNodeVanished,
        SlurmDemandObserved,
        K8sNodeObserved,
        K8sNodeVanished,
        K8sWorkloadObserved,
        K8sDemandObserved,
        K8sNodesetObserved,
        SourceHealth,
        SlurmHookReceived,
        OperatorPinned,
        TransitionStarted,
        TransitionCompleted,
        TransitionAborted,
        ActionRequested,
        ActionSucceeded,
        ActionFailed,
        LeaderElected,
        LogArchived,
        NodeForgotten,
        PoolsConfigured,
    )
}



# ---------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Event:
    """An event to append: the payload plus its subject (node or pool name)."""

    subject: str
    payload: Payload
    causation_seq: int | None = None

    @property
    def kind(self) -> str:
        return self.payload.kind


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored in the log, with the position the log gave it."""

    seq: int
    recorded_at: datetime
    epoch: int
    subject: str
    payload: Payload
    causation_seq: int | None = None

    @property
    def kind(self) -> str:
        return self.payload.kind
