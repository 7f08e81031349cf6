"""Every name sunkd reads or writes on Slurm and Kubernetes objects, in one place.

Operators, dashboards, admission policies and other controllers key on these strings, so
they are part of sunkd's interface: nothing else in the package spells them (a test greps
for `"sunkd.io/` outside this module). Modelled on Slinky's `api/v1beta1/well_known.go`.
Pure constants; no imports.
"""

from __future__ import annotations

# --- API group ------------------------------------------------------------------------
GROUP = "sunkd.io"  # API group of the Nodeset custom resource (manifests/crds/nodeset.yaml)
PREFIX = "sunkd.io/"  # prefix of every sunkd label, annotation and taint key
API_VERSION = "sunkd.io/v1alpha1"  # apiVersion of Nodeset objects

# --- labels ---------------------------------------------------------------------------
LABEL_OWNER = "sunkd.io/owner"  # on Nodes: "slurm" or "kubernetes", who owns the node now
LABEL_POOL = "sunkd.io/pool"  # on Nodes, set by operators: the conventional Nodeset selector
LABEL_SLURM_NODE_NAME = "sunkd.io/slurm-node-name"  # on Nodes: the Slurm name, when it differs
OWNER_SLURM = "slurm"  # value of LABEL_OWNER / TAINT_OWNER: Slurm owns the node
OWNER_KUBERNETES = "kubernetes"  # value of LABEL_OWNER: Kubernetes owns the node

# --- taints ---------------------------------------------------------------------------
TAINT_OWNER = "sunkd.io/owner"  # NoSchedule taint `sunkd.io/owner=slurm` keeps pool pods off
TAINT_OWNER_EFFECT = "NoSchedule"  # effect of TAINT_OWNER (running pods are not evicted by it)
# sunkd's own hold (the mirror of a Slurm hold): NoSchedule, value "slurm". sunkd never sets
# spec.unschedulable, so every cordon is an operator's and sunkd never lifts one.
TAINT_HOLD = "sunkd.io/slurm-hold"

# --- annotations ----------------------------------------------------------------------
ANNOTATION_LEGACY_CORDONED_BY = "sunkd.io/cordoned-by"  # legacy (written by older sunkd); removed
# On Nodes: why sunkd holds it. The key keeps the word of sunkd's first releases, which
# wrote it before the hold became a taint: Nodes and operators' tooling carry it.
ANNOTATION_HOLD_REASON = "sunkd.io/cordon-reason"
ANNOTATION_PIN = "sunkd.io/pin"  # on Nodes, set by operators: slurm | kubernetes | auto
ANNOTATION_SLURM_STATE = "sunkd.io/slurm-state"  # on Nodes: Slurm's state, mirrored by sunkd
ANNOTATION_SLURM_REASON = "sunkd.io/slurm-reason"  # on Nodes: Slurm's reason, mirrored by sunkd
LEGACY_CORDONED_BY_VALUE = "sunkd"  # value of ANNOTATION_LEGACY_CORDONED_BY

# --- Kubernetes Events (reason field) and their reporting component --------------------
EVENT_COMPONENT = "sunkd"  # Event source.component
EVENT_REPORTING_COMPONENT = "sunkd.io/sunkd"  # Event reportingComponent (events.k8s.io style)
EVENT_LOCKED = "SunkdLocked"  # sunkd tainted a node for Slurm
EVENT_UNLOCKED = "SunkdUnlocked"  # sunkd removed its taint: the node is Kubernetes'
# sunkd added / removed its hold taint (mirroring a Slurm hold). The reasons keep the
# first releases' words: alerts and `kubectl get events --field-selector` select by them.
EVENT_HELD = "SunkdCordoned"
EVENT_RELEASED = "SunkdUncordoned"
EVENT_ANNOTATED = "SunkdAnnotated"  # sunkd mirrored Slurm state into annotations
EVENT_EVICTED = "SunkdEvicted"  # sunkd evicted a pod to reclaim a node for Slurm
EVENT_CONFLICT = "SunkdConflict"  # Warning: a Slurm job and a pod share the node
EVENT_IDENTITY_CONFLICT = "SunkdIdentityConflict"  # Warning: two Nodes claim one Slurm name
EVENT_POOL_CONFLICT = "SunkdPoolConflict"  # Warning: two Nodesets select the node
EVENT_INVALID_PIN = "SunkdInvalidPin"  # Warning: sunkd.io/pin is not slurm|kubernetes|auto
EVENT_GRES_MISMATCH = "SunkdGresMismatch"  # Warning: Slurm registered other GPUs (held)
# Warning: slurmctld refused the node's slurmd registration (INVALID_REG; held)
EVENT_INVALID_REGISTRATION = "SunkdInvalidRegistration"
EVENT_UNPARSED_QUANTITY = "SunkdUnparsedQuantity"  # Warning: an allocatable did not parse

# --- Nodeset status condition types and their reasons -----------------------------------
CONDITION_READY = "Ready"  # sources fresh: sunkd may act
CONDITION_PROGRESSING = "Progressing"  # some node is changing owner
CONDITION_DEGRADED = "Degraded"  # nodes held or actions failing
CONDITION_GRES_CONSISTENT = "GresConsistent"  # Slurm's GRES equals the Nodes' GPUs
CONDITION_TOPOLOGY_APPLIED = "TopologyApplied"  # slurmctld has the rendered topology
REASON_GRES_MATCH = "GresMatch"  # GresConsistent=True
REASON_GRES_MISMATCH = "GresMismatch"  # GresConsistent=False
REASON_SOURCES_FRESH = "SourcesFresh"  # Ready=True
REASON_SOURCES_STALE = "SourcesStale"  # Ready=False
REASON_MOVING = "Moving"  # Progressing=True
REASON_SETTLED = "Settled"  # Progressing=False
REASON_NODES_HELD = "NodesHeld"  # Degraded=True
REASON_AS_EXPECTED = "AsExpected"  # Degraded=False (and SlurmdDegraded=False)
# A Nodeset with spec.slurmd (domain/policy/slurmdconditions.py): its slurmd pods.
CONDITION_SLURMD_READY = "SlurmdReady"  # every Slurm-owned node's slurmd registered
CONDITION_SLURMD_PROGRESSING = "SlurmdProgressing"  # pods being replaced, repaired, started
CONDITION_SLURMD_DEGRADED = "SlurmdDegraded"  # a node's slurmd pod needs someone
REASON_ALL_REGISTERED = "AllRegistered"  # SlurmdReady=True
REASON_NOT_ALL_REGISTERED = "NotAllRegistered"  # SlurmdReady=False
REASON_ROLLING_UPDATE = "RollingUpdate"  # SlurmdProgressing=True
REASON_REPAIRING = "Repairing"  # SlurmdProgressing=True
REASON_STARTING = "Starting"  # SlurmdProgressing=True
REASON_INVALID_REGISTRATION = "InvalidRegistration"  # SlurmdDegraded=True: INVALID_REG
REASON_UNREGISTERED = "Unregistered"  # SlurmdDegraded=True: Slurm does not hear the pod
REASON_REPAIR_FAILING = "RepairFailing"  # SlurmdDegraded=True: recreated again and again
REASON_DELETING = "Deleting"  # SlurmdProgressing=True: the Nodeset's pods go (finalizer)

# --- Kubernetes objects sunkd owns ----------------------------------------------------
LEASE_NAME = "sunkd-leader"  # coordination.k8s.io Lease for the optional Kubernetes election
# slurmd pods of a Nodeset with spec.slurmd (kubernetes/slurmd_pod.py). The labels select
# them; what makes a pod sunkd's is the controller owner reference to the Nodeset's uid
# (domain/policy/slurmd.py): a pod with the labels and another owner is an impostor.
LABEL_SLURMD_NODESET = "sunkd.io/slurmd-nodeset"  # on slurmd pods: the Nodeset's name
LABEL_SLURMD_NODE = "sunkd.io/slurmd-node"  # on slurmd pods: the Slurm node name (if a label)
ANNOTATION_SLURMD_NODE = "sunkd.io/slurmd-node"  # on slurmd pods: the exact Slurm node name
ANNOTATION_SLURMD_REVISION = "sunkd.io/slurmd-revision"  # on slurmd pods: hash of spec.slurmd
NODESET_KIND = "Nodeset"  # kind in the slurmd pods' owner reference
# On sunkd's own slurmd pods while Slurm reports the node busy (ALLOCATED, MIXED,
# COMPLETING): the one PodDisruptionBudget per Nodeset (no disruption allowed) selects
# the Nodeset's pods with this label, so an eviction (`kubectl drain`) of a busy slurmd pod is
# refused (429) by the API server. Removed once Slurm reports the node idle and in contact.
LABEL_SLURMD_BUSY = "sunkd.io/slurmd-busy"
SLURMD_BUSY_VALUE = "true"  # value of LABEL_SLURMD_BUSY
PDB_SLURMD_BUSY_SUFFIX = "-slurmd-busy"  # the PDB's name: <nodeset> + this suffix
# On each Nodeset with spec.slurmd (domain/policy/slurmdfinalizer.py): the Nodeset stays
# (Terminating) after a delete until sunkd removed its slurmd pods the lend's way (drained,
# idle, in contact); the garbage collector would delete them at once otherwise.
FINALIZER_SLURMD_PODS = "sunkd.io/slurmd-pods"

# --- Slurm reasons --------------------------------------------------------------------
# Every reason sunkd writes starts with REASON_PREFIX; a reason that does not is foreign, and
# one that does is sunkd's only where its log proves it (domain/authorship.py).
REASON_PREFIX = "sunkd:"  # any drain reason sunkd wrote
REASON_LEND = "sunkd: lent to kubernetes"  # drain for a lend, followed by " [tx ID]"
REASON_MIRROR = "sunkd: k8s "  # drain mirroring Kubernetes (NotReady, cordon), + the why
# drain while sunkd repairs a Slurm-owned node's slurmd pod, + " (<what is wrong>)"
REASON_SLURMD_REPAIR = "sunkd: slurmd pod repair"
# drain while sunkd replaces a Slurm-owned node's outdated slurmd pod (rolling update)
REASON_SLURMD_UPDATE = "sunkd: slurmd pod update"
# drain before sunkd deletes the slurmd pods of a Nodeset deleted (or whose spec.slurmd
# was removed), + " (Nodeset deleted)" / " (spec.slurmd removed)"; left on the node after
REASON_SLURMD_REMOVED = "sunkd: slurmd pods removed"
# The reason slurmctld gives a node it sets DOWN for not hearing its slurmd past
# SlurmdTimeout (`node_not_resp`/`set_node_down` in src/slurmctld/node_mgr.c); the one
# DOWN that ReturnToService=1 lifts on registration.
SLURM_REASON_NOT_RESPONDING = "Not responding"
