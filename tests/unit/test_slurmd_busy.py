"""The busy label on sunkd's slurmd pods (domain/policy/slurmdbusy.py), which the Nodeset's
PodDisruptionBudget selects: busy -> label, idle and in contact -> unlabel, anything
unknown (stale sources, the node not seen by Slurm, out of contact without an
allocation, the pods unknown) -> nothing; an impostor or another Nodeset's pod is never
labelled. Then over the folded state through `decide` (a label action of no transition,
once, with its args), the source's PodRef, and the executor's re-check with Slurm before
an unlabel."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sWorkloadObserved, Label, SlurmNodeObserved
from sunkd.domain.policy.slurmd import SlurmdNode
from sunkd.domain.policy.slurmdbusy import (
    BUSY_ARG,
    VERB_SLURMD_LABEL,
    label_args,
    label_steps,
    wanted,
)
from sunkd.domain.ports import ActionError
from sunkd.domain.slurmnode import in_contact, slurm_busy
from sunkd.domain.state import OpenAction, Phase
from sunkd.kubernetes.slurmd_pod import render, seen_pod
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.slurm.model import SlurmNode
from tests.unit import test_slurmd_ownership as ownership
from tests.unit.domain_world import slurm_obs
from tests.unit.test_slurmd_plan import NODESET, node, observed, own

BUSY = observed("ALLOCATED", alloc=4)
IDLE = observed("IDLE")


def _kv(labels: tuple[Label, ...]) -> dict[str, str]:
    return {label.key: label.value for label in labels}


def steps(*nodes: SlurmdNode, fresh: bool = True) -> list[tuple[str, bool]]:
    return [(s.pod, s.busy) for s in label_steps(NODESET, nodes, sources_fresh=fresh)]


def test_a_busy_node_gets_its_pod_labelled_and_an_idle_one_unlabelled() -> None:
    assert steps(node(Phase.SLURM, (own("n1"),), slurm=BUSY)) == [("slurm/gpu-n1", True)]
    assert steps(node(Phase.SLURM, (own("n1", busy=True),), slurm=BUSY)) == []
    assert steps(node(Phase.SLURM, (own("n1", busy=True),), slurm=IDLE)) \
        == [("slurm/gpu-n1", False)]
    assert steps(node(Phase.SLURM, (own("n1"),), slurm=IDLE)) == []
    # Busy in every form Slurm reports it: MIXED, COMPLETING (state or flag), CPUs.
    for busy in (observed("MIXED", alloc=1), observed("COMPLETING"),
                 observed("IDLE", ("COMPLETING",)), observed("IDLE", alloc=2),
                 observed("ALLOCATED", ("DRAIN",), 4)):
        assert steps(node(Phase.TO_K8S, (own("n1"),), slurm=busy)) \
            == [("slurm/gpu-n1", True)], busy


def test_unknown_is_not_idle_the_label_stays() -> None:
    labelled = (own("n1", busy=True),)
    assert steps(node(Phase.SLURM, labelled, slurm=IDLE), fresh=False) == []
    # Not seen by Slurm: SlurmdNode.slurm None (node() fills a default, so build it).
    assert steps(SlurmdNode("n1", "k-n1", Phase.SLURM, None, True, labelled)) == []
    for unknown in (observed("IDLE", ("NOT_RESPONDING",)), observed("DOWN"),
                    observed("DOWN", ("DRAIN", "NOT_RESPONDING")), observed("UNKNOWN"),
                    observed("IDLE", ("POWERED_DOWN",))):
        assert steps(node(Phase.SLURM, labelled, slurm=unknown)) == [], unknown
    assert steps(node(Phase.SLURM, None, slurm=IDLE)) == []  # pods unknown
    # ... while busy out of contact still labels: jobs may run there.
    assert steps(node(Phase.SLURM, (own("n1"),),
                      slurm=observed("ALLOCATED", ("NOT_RESPONDING",), 4))) \
        == [("slurm/gpu-n1", True)]


def test_an_impostor_or_another_nodesets_pod_is_never_labelled() -> None:
    impostor = own("n1", name="impostor", uid="u9", controller_uid="someone-else")
    other = own("n1", name="cpu-n1", uid="u8", nodeset_label="cpu")
    wrong_node = own("n2", name="gpu-n2", uid="u7")
    unowned = own("n1", name="x", uid="u6", controller_kind=None, controller_uid=None)
    pods = (impostor, other, wrong_node, unowned)
    assert steps(node(Phase.SLURM, pods, slurm=BUSY)) == []
    assert steps(node(Phase.SLURM, (*pods, own("n1")), slurm=BUSY)) \
        == [("slurm/gpu-n1", True)]


def test_terminating_and_ended_pods_are_left_alone() -> None:
    assert steps(node(Phase.SLURM, (own("n1", deleting=True),), slurm=BUSY)) == []
    for phase in ("Failed", "Succeeded"):
        assert steps(node(Phase.SLURM, (own("n1", phase=phase),), slurm=BUSY)) == []
    assert steps(node(Phase.SLURM, (own("n1", phase="Pending"),), slurm=BUSY)) \
        == [("slurm/gpu-n1", True)]


def test_the_args_say_which_pod_of_which_nodeset_and_which_way() -> None:
    (step,) = label_steps(NODESET, [node(Phase.SLURM, (own("n1"),), slurm=BUSY)],
                          sources_fresh=True)
    assert _kv(label_args(step, NODESET)) == {
        "pod": "slurm/gpu-n1", "pod_uid": "u-n1", "nodeset": "slurm/gpu",
        "nodeset_uid": "uid-gpu", BUSY_ARG: "1"}
    assert step.reason.startswith(wk.REASON_PREFIX)


_STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "COMPLETING", "DOWN", "UNKNOWN",
                           "FUTURE", "ERROR"])
_FLAGS = st.sets(st.sampled_from(["DRAIN", "COMPLETING", "NOT_RESPONDING", "POWERED_DOWN",
                                  "UNDRAIN", "FAIL"]))


@given(state=_STATES, flags=_FLAGS, alloc=st.integers(0, 4), labelled=st.booleans(),
       seen=st.booleans())
def test_never_unlabelled_unless_idle_and_in_contact(state: str, flags: set[str],
                                                      alloc: int, labelled: bool,
                                                      seen: bool) -> None:
    slurm = SlurmNodeObserved(node="n1", state=state, flags=tuple(sorted(flags)), cpus=4,
                              alloc_cpus=alloc) if seen else None
    view = SlurmdNode("n1", "k-n1", Phase.SLURM, slurm, True, (own("n1", busy=labelled),))
    found = label_steps(NODESET, [view], sources_fresh=True)
    want = wanted(view)
    if slurm is not None and slurm_busy(slurm):
        assert want is True
    for step in found:
        if not step.busy:
            assert slurm is not None and in_contact(slurm) and not slurm_busy(slurm)
    assert bool(found) == (want is not None and want != labelled)


# ---------------------------------------------------------------- the source's view


def test_the_source_reads_the_label_of_sunkds_pod() -> None:
    from sunkd.domain.policy.slurmd import SlurmdNodeset

    obj = render(NODESET.spec, nodeset="gpu", namespace="slurm", nodeset_uid="uid-gpu",
                 slurm_node="n1", k8s_node="k1", name="gpu-n1")
    assert seen_pod(obj).busy is False
    obj["metadata"]["labels"][wk.LABEL_SLURMD_BUSY] = wk.SLURMD_BUSY_VALUE
    assert seen_pod(obj).busy is True
    assert isinstance(NODESET, SlurmdNodeset)


# ---------------------------------------------------------------- through decide()


def test_decide_labels_the_busy_pod_once_and_unlabels_it_when_idle() -> None:
    log = ownership.world()
    log.add(slurm_obs("n1", state="ALLOCATED", alloc_cpus=4), 3.0)
    first = ownership.step(log, 3.0)
    (label,) = [a for a in ownership.requests(first) if a.verb == VERB_SLURMD_LABEL]
    assert label.side == wk.OWNER_KUBERNETES and label.transition_id is None
    args = _kv(label.args)
    assert (args["pod"], args["pod_uid"], args[BUSY_ARG]) == ("default/gpu-n1", "p1", "1")
    assert VERB_SLURMD_LABEL not in ownership.verbs(ownership.step(log, 3.5))  # open
    ownership.succeed(log, first, 3.6)
    log.add(K8sWorkloadObserved(node="n1", pods=(ownership.own(started_at=2.0,
                                                               slurmd_busy=True),)), 3.7)
    assert VERB_SLURMD_LABEL not in ownership.verbs(ownership.step(log, 4.0))
    log.add(slurm_obs("n1"), 5.0)
    second = ownership.step(log, 5.0)
    (unlabel,) = [a for a in ownership.requests(second) if a.verb == VERB_SLURMD_LABEL]
    assert _kv(unlabel.args)[BUSY_ARG] == "0"
    ownership.succeed(log, second, 5.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(ownership.own(started_at=2.0),)), 5.2)
    # A job seconds later: labelled again at once (no catch-up wait after a success).
    log.add(slurm_obs("n1", state="MIXED", alloc_cpus=1), 6.0)
    (again,) = [a for a in ownership.requests(ownership.step(log, 6.0))
                if a.verb == VERB_SLURMD_LABEL]
    assert _kv(again.args)[BUSY_ARG] == "1"


def test_decide_labels_nothing_without_spec_slurmd() -> None:
    log = ownership.world(slurmd=False)
    log.add(slurm_obs("n1", state="ALLOCATED", alloc_cpus=4), 3.0)
    assert VERB_SLURMD_LABEL not in ownership.verbs(ownership.step(log, 3.0))


# ---------------------------------------------------------------- the executor


class _Reader:
    def __init__(self, nodes: list[SlurmNode]) -> None:
        self.nodes = nodes

    async def get_nodes(self) -> list[SlurmNode]:
        return self.nodes


class _Kube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    async def slurmd(self, verb: str, slurm_node: str, k8s_node: str,
                     args: dict[str, str]) -> bool:
        self.calls.append((verb, args))
        return True

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call {name}")


def _action(busy: str) -> OpenAction:
    return OpenAction("a1", None, wk.OWNER_KUBERNETES, VERB_SLURMD_LABEL, "n1", 1, "r",
                      (Label("k8s_node", "k1"), Label("pod", "default/gpu-n1"),
                       Label("pod_uid", "p1"), Label("nodeset", "default/gpu"),
                       Label("nodeset_uid", "U"), Label(BUSY_ARG, busy)), 1.0, 1)


def _slurm(state: str, flags: set[str] | None = None, alloc: int = 0) -> SlurmNode:
    return SlurmNode(name="n1", state=state, flags=frozenset(flags or ()), cpus=4,
                     alloc_cpus=alloc)


async def test_the_executor_asks_slurm_again_before_an_unlabel() -> None:
    for found in ([_slurm("ALLOCATED", alloc=4)], [_slurm("IDLE", {"NOT_RESPONDING"})], []):
        kube = _Kube()
        executor = ActuatorExecutor(None, kube, _Reader(found))  # type: ignore[arg-type]
        with pytest.raises(ActionError, match="refusing to unlabel") as raised:
            await executor.execute(_action("0"), None)
        assert raised.value.retryable and kube.calls == []
    kube = _Kube()
    with pytest.raises(ActionError, match="no Slurm reader"):
        await ActuatorExecutor(None, kube, None).execute(  # type: ignore[arg-type]
            _action("0"), None)
    executor = ActuatorExecutor(None, kube, _Reader([_slurm("IDLE")]))  # type: ignore[arg-type]
    assert await executor.execute(_action("0"), None) is True
    # Labelling only protects: no Slurm read needed.
    assert await ActuatorExecutor(None, kube, None).execute(  # type: ignore[arg-type]
        _action("1"), None) is True
    assert [verb for verb, _ in kube.calls] == [VERB_SLURMD_LABEL, VERB_SLURMD_LABEL]


def test_a_snapshot_keeps_the_busy_label() -> None:
    """A sunkd restarted from a snapshot decides as one that replayed the log: the pod's
    busy label survives the snapshot."""
    import json

    from sunkd.domain.events import PodRef
    from sunkd.domain.snapshot import state_from_json, state_to_json

    log = ownership.world()
    labelled = PodRef("default", "gpu-n1", "Running", uid="p1", pool_pod=False,
                      slurmd="n1", slurmd_nodeset=ownership.UID, started_at=2.0,
                      slurmd_busy=True)
    log.add(K8sWorkloadObserved(node="n1", pods=(labelled,)), 3.0)
    state = log.state()
    again = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert again.nodes["n1"].pods == (labelled,)
    assert again.pod_reports == state.pod_reports
