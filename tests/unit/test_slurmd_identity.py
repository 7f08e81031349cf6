"""sunkd's own slurmd pod is Slurm's daemon, not a pod beside Slurm: `running_pods` leaves
it out (so it is no conflict, no reason to wait before a resume, and never evicted), while
a slurmd pod of another node and an impostor (reported with `slurmd=""`) count. The pod's
claim is read from its metadata only when a Nodeset is its controller owner. Over the
folded state: the plan's view (`nodes_from_state`), the Nodeset's `status.slurmd`, and the
executor refusing a delete it cannot confirm with Slurm."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sunkd.domain import wellknown as wk
from sunkd.domain.events import (
    K8sNodesetObserved,
    K8sWorkloadObserved,
    Label,
    PodRef,
    SlurmdSpec,
)
from sunkd.domain.ownership import no_pods, running_pod_count, running_pods
from sunkd.domain.policy import VERB_UNLOCK, effective_pools
from sunkd.domain.policy.slurmd import (
    REGISTER_BOUND_SECONDS,
    VERB_SLURMD_DELETE,
    SlurmdNodeset,
    nodes_from_state,
    plan,
    revision,
)
from sunkd.domain.ports import ActionError
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import ClusterState, NodeState, OpenAction
from sunkd.kubernetes.nodeset_status import build_nodeset_status
from sunkd.kubernetes.normalize import slim_pod, slurmd_claim
from sunkd.kubernetes.payloads import Payloads, slurmd_node
from sunkd.kubernetes.slurmd_pod import render
from sunkd.runtime.executor import ActuatorExecutor
from tests.unit.domain_world import POOL, POOL_LABEL, slurm_obs
from tests.unit.test_domain_policy import _cluster


def test_own_slurmd_pod_is_no_running_pod() -> None:
    own = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1")
    node = NodeState(name="n1", pods=(own,))
    assert running_pods(node) == [] and no_pods(node)
    other = PodRef("hpc", "gpu-n2", "Running", uid="u2", pool_pod=False, slurmd="n2")
    impostor = PodRef("hpc", "impostor", "Running", uid="u3", pool_pod=False)
    node = NodeState(name="n1", pods=(own, other, impostor))
    assert running_pods(node) == ["hpc/gpu-n2", "hpc/impostor"] and not no_pods(node)
    assert not no_pods(NodeState(name="n1", pods=None))  # unknown stays unknown


def pod(**meta: Any) -> dict[str, Any]:
    obj = render(SlurmdSpec(image="i"), nodeset="gpu", namespace="hpc", nodeset_uid="U",
                 slurm_node="n1", k8s_node="k1", name="gpu-n1")
    obj["metadata"].update(meta)
    obj["metadata"]["uid"] = "p1"
    obj["status"] = {"phase": "Running"}
    return obj


def test_the_claim_needs_a_nodeset_as_controller_owner() -> None:
    assert slim_pod(pod()).slurmd_claim == ("U", "gpu", "n1")
    assert slim_pod(pod(ownerReferences=[])).slurmd_claim is None
    wrong_kind = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gpu", "uid": "U",
                   "controller": True}]
    assert slim_pod(pod(ownerReferences=wrong_kind)).slurmd_claim is None
    other_name = [{"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset", "name": "cpu",
                   "uid": "U", "controller": True}]
    assert slim_pod(pod(ownerReferences=other_name)).slurmd_claim is None
    assert slurmd_claim({"labels": {"app": "x"}}) is None
    assert slurmd_claim({"labels": {"sunkd.io/slurmd-nodeset": "gpu"}, "annotations": 5}) is None


# ------------------------------------------------ the plan over the folded state


def _folded(pods: tuple[PodRef, ...] | None, *, lent: bool = False,
            busy: bool = False) -> ClusterState:
    log = _cluster(1, kubernetes=("n1",) if lent else ())
    if busy:
        log.add(slurm_obs("n1", state="ALLOCATED", alloc_cpus=4), 2.0)
    if pods is not None:
        log.add(K8sWorkloadObserved(node="n1", pool="", pods=pods), 2.0)
    return log.state()



def _plan(state: ClusterState) -> list[tuple[str, str]]:
    nodeset = SlurmdNodeset("gpu", "hpc", "U", SlurmdSpec(image="i"))
    nodes = nodes_from_state(state, nodeset, [state.nodes["n1"]], 10.0)
    return [(s.verb, s.pod) for s in plan(nodeset, nodes, 10.0, sources_fresh=True)]


def test_from_the_fold_a_slurm_node_gets_its_pod_and_keeps_it_under_a_job() -> None:
    own = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                 slurmd_nodeset="U")
    assert _plan(_folded(())) == [("slurmd-create", "hpc/gpu-n1")]
    assert _plan(_folded((own,))) == [("", "")]
    # Busy with its own slurmd pod running: no conflict hold, nothing to do.
    assert _plan(_folded((own,), busy=True)) == [("", "")]
    # Busy beside an impostor: a conflict (HELD), nothing created or deleted.
    impostor = PodRef("hpc", "gpu-n1", "Running", uid="u9", pool_pod=False)
    assert _plan(_folded((impostor,), busy=True)) == [("", "")]


def test_from_the_fold_a_lent_drained_node_loses_its_pod() -> None:
    own = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                 slurmd_nodeset="U")
    assert _plan(_folded((own,), lent=True)) == [("slurmd-delete", "hpc/gpu-n1")]
    assert _plan(_folded((), lent=True)) == [("", "")]


def test_the_nodeset_status_counts_its_slurmd_pods() -> None:
    log = _cluster(3, kubernetes=("n3",))
    spec = SlurmdSpec(image="i")
    log.add(K8sNodesetObserved(pool=POOL, uid="U", node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",), slurmd=spec), 2.0)
    own = PodRef("default", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                 slurmd_nodeset="U", started_at=2.5)
    starting = PodRef("default", "gpu-n2", "Pending", uid="u2", pool_pod=False, slurmd="n2",
                      slurmd_nodeset="U")
    log.add(K8sWorkloadObserved(node="n1", pool="", pods=(own,)), 3.0)
    log.add(K8sWorkloadObserved(node="n2", pool="", pods=(starting,)), 3.0)
    state = log.state()
    status = build_nodeset_status(state, effective_pools(state), POOL, 1, 10.0)
    assert status["slurmd"] == {"desired": 2, "current": 2, "ready": 1, "registered": 1,
                                "revision": revision(spec)}
    log.add(K8sNodesetObserved(pool=POOL, uid="U", node_selector=(POOL_LABEL,),
                               slurmd_finalizer=True,
                               partitions=("gpu",)), 4.0)
    state = log.state()
    assert "slurmd" not in build_nodeset_status(state, effective_pools(state), POOL, 1, 10.0)


async def test_the_executor_refuses_a_slurmd_delete_it_cannot_confirm_with_slurm() -> None:
    """No Slurm reader: the delete is refused before any Kubernetes call (fail closed),
    as for `unlock`."""
    action = OpenAction("a1", None, wk.OWNER_KUBERNETES, VERB_SLURMD_DELETE, "n1", 1, "lend",
                        (Label("pod", "hpc/gpu-n1"),), 0.0, 1)
    with pytest.raises(ActionError, match="no Slurm reader to confirm it is drained") as raised:
        await ActuatorExecutor(None, None, None).execute(action, None)
    assert raised.value.retryable


def test_the_count_and_the_list_of_running_pods_agree_on_slurmd_pods() -> None:
    """`running_pod_count` is `len(running_pods)` (the policy counts by one and names by
    the other): a node's own slurmd pod is in neither, another node's is in both."""
    own = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1")
    other = PodRef("hpc", "gpu-n2", "Running", uid="u2", pool_pod=False, slurmd="n2")
    for pods in ((own,), (other,), (own, other), ()):
        node = NodeState(name="n1", pods=pods)
        assert running_pod_count(node) == len(running_pods(node))


async def test_the_executor_refuses_an_unlock_it_cannot_confirm_with_slurm() -> None:
    """The one unsafe action asks Slurm right before; with no Slurm reader it cannot, so
    it is refused (retried), never run unconfirmed."""
    action = OpenAction("a2", None, wk.OWNER_KUBERNETES, VERB_UNLOCK, "n1", 1, "lend",
                        (), 0.0, 1)
    with pytest.raises(ActionError, match="no Slurm reader") as raised:
        await ActuatorExecutor(None, None, None).execute(action, None)
    assert raised.value.retryable


# ------------------------------------------- whose slurmd pod: the owning Nodeset's uid


def test_another_nodesets_slurmd_pod_for_the_same_node_is_not_this_nodesets() -> None:
    """Two Nodesets can name the same Slurm node (a Nodeset replaced by another, or two
    selecting one Node by mistake): the pod of the other is foreign to this one's plan,
    never deleted by it and never taken for its registered pod."""
    theirs = PodRef("hpc", "cpu-n1", "Running", uid="u7", pool_pod=False, slurmd="n1",
                    slurmd_nodeset="OTHER")
    ours = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                  slurmd_nodeset="U")
    assert _plan(_folded((theirs,), lent=True)) == [("", "")]
    assert _plan(_folded((theirs, ours), lent=True)) == [("slurmd-delete", "hpc/gpu-n1")]
    nodeset = SlurmdNodeset("gpu", "hpc", "U", SlurmdSpec(image="i"))
    state = _folded((theirs,))
    (view,) = nodes_from_state(state, nodeset, [state.nodes["n1"]], 10.0)
    (step,) = plan(nodeset, [view], 10.0, sources_fresh=True)
    assert step.verb == "" and "foreign pods" in step.reason and "hpc/cpu-n1" in step.reason


def test_the_source_reports_the_owning_nodesets_uid() -> None:
    facts = slim_pod(pod())
    nodesets = {"hpc/gpu": K8sNodesetObserved(slurmd_finalizer=True, pool="hpc/gpu", uid="U",
                                              slurmd=SlurmdSpec(image="i"))}
    assert slurmd_node(facts, nodesets) == ("n1", "U")
    stranger = {"hpc/gpu": K8sNodesetObserved(slurmd_finalizer=True, pool="hpc/gpu", uid="V",
                                              slurmd=SlurmdSpec(image="i"))}
    assert slurmd_node(facts, stranger) == ("", "")


def test_a_snapshot_keeps_whose_slurmd_pod_it_is() -> None:
    """A restart from a snapshot must not turn sunkd's own slurmd pods into foreign ones
    (a reclaim would wait for them forever, a busy node would read as a conflict)."""
    own = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                 slurmd_nodeset="U")
    state = _folded((own,))
    again = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert again.nodes["n1"].pods == (own,)
    going = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                   slurmd_nodeset="U", deleting=True, started_at=5.0)
    state = _folded((going,))
    again = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert again.nodes["n1"].pods == (going,)
    assert again.pod_reports == state.pod_reports


# ------------------------------------------------ a pod's deletion and start, carried


def test_the_source_reads_a_pods_deletion_and_when_its_slurmd_container_started() -> None:
    """`started_at` is the slurmd container's start (the node's clock, as slurmd's own
    start time in Slurm), read while the pod is Ready: not when it turned Ready."""
    ready = {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}],
        "containerStatuses": [
            {"name": "sidecar", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}},
            {"name": "slurmd", "state": {"running": {"startedAt": "2026-01-01T00:00:09Z"}}}]}
    obj = pod(deletionTimestamp="2026-01-01T00:01:00Z")
    obj["status"] = ready
    facts = slim_pod(obj)
    assert facts.deleting and facts.started_at == 1767225609.0
    plain = slim_pod(pod())
    assert not plain.deleting and plain.started_at is None
    waiting = pod()
    waiting["status"] = {**ready, "containerStatuses": [
        {"name": "slurmd", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    assert slim_pod(waiting).started_at is None
    not_ready = pod()
    not_ready["status"] = {**ready, "conditions": [{"type": "Ready", "status": "False"}]}
    assert slim_pod(not_ready).started_at is None


def test_a_terminating_own_pod_is_neither_live_nor_deleted_again() -> None:
    going = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                   slurmd_nodeset="U", deleting=True)
    assert _plan(_folded((going,), lent=True)) == [("", "")]  # its delete was sent
    nodeset = SlurmdNodeset("gpu", "hpc", "U", SlurmdSpec(image="i"))
    state = _folded((going,))
    (view,) = nodes_from_state(state, nodeset, [state.nodes["n1"]], 10.0)
    (step,) = plan(nodeset, [view], 10.0, sources_fresh=True)
    assert step.verb == "" and "still terminating" in step.reason


def test_a_pod_running_past_the_bound_without_slurm_hearing_it_is_reported() -> None:
    running = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                     slurmd_nodeset="U", started_at=0.0)
    nodeset = SlurmdNodeset("gpu", "hpc", "U", SlurmdSpec(image="i"))
    log = _cluster(1)
    log.add(K8sWorkloadObserved(node="n1", pool="", pods=(running,)), 2.0)
    log.add(slurm_obs("n1", state="IDLE", flags=("NOT_RESPONDING",)), 3.0)
    state = log.state()
    now = REGISTER_BOUND_SECONDS + 1.0
    (view,) = nodes_from_state(state, nodeset, [state.nodes["n1"]], 10.0)
    (step,) = plan(nodeset, [view], now, sources_fresh=True)
    assert "unregistered" in step.reason, step


# ------------------------------------------------ a slurmd pod's revision, carried


def test_the_source_reports_a_slurmd_pods_revision_and_no_other_pods() -> None:
    """The rolling update compares each pod's revision annotation with the spec's: the
    source reads it for slurmd pods (claim and owner agree) and for no other pod."""
    facts = slim_pod(pod())
    assert facts.slurmd_revision == revision(SlurmdSpec(image="i"))
    nodesets = {"hpc/gpu": K8sNodesetObserved(slurmd_finalizer=True, pool="hpc/gpu", uid="U",
                                              slurmd=SlurmdSpec(image="i"))}
    unannotated = pod()
    del unannotated["metadata"]["annotations"][wk.ANNOTATION_SLURMD_REVISION]
    assert slim_pod(unannotated).slurmd_revision == ""
    odd = pod()
    odd["metadata"]["annotations"][wk.ANNOTATION_SLURMD_REVISION] = 7
    assert slim_pod(odd).slurmd_revision == ""
    other = pod(ownerReferences=[])  # no claim: not read at all
    assert slim_pod(other).slurmd_revision == ""

    class Pods:  # the pod watch's cache and index, as the source keeps them
        cache = {"hpc/gpu-n1": facts, "hpc/impostor": slim_pod(pod(
            name="impostor", uid="p2", ownerReferences=[{
                "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset", "name": "gpu",
                "uid": "V", "controller": True}]))}

        def on(self, node: str) -> list[str]:
            return list(self.cache)

    class View:
        def pool_of(self, labels: object, nodesets: object) -> None:
            return None

    report = Payloads(Pods(), Pods(), View()).workload(  # type: ignore[arg-type]
        "k1", {}, nodesets)
    assert {p.name: p.slurmd_revision for p in report.pods} == {
        "gpu-n1": revision(SlurmdSpec(image="i")), "impostor": ""}


def test_a_snapshot_keeps_a_slurmd_pods_revision() -> None:
    rev = PodRef("hpc", "gpu-n1", "Running", uid="u1", pool_pod=False, slurmd="n1",
                 slurmd_nodeset="U", started_at=5.0, slurmd_revision="abc123")
    plain = PodRef("hpc", "web", "Running", uid="u2")
    state = _folded((rev, plain))
    body = state_to_json(state)
    again = state_from_json(json.loads(json.dumps(body)))
    assert again.nodes["n1"].pods == (rev, plain)
    assert again.pod_reports == state.pod_reports
