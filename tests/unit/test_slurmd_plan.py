"""The slurmd-pod plan (domain/policy/slurmd.py) against adversaries: impostor pods (the
labels, another owner), pods of another node or Nodeset, foreign pods, busy and
out-of-contact nodes, unknown pods, stale sources, no owner taint, pods terminating.

Properties: never a delete under a job (or of a node not drained, idle and in contact),
never a delete of a pod that is not sunkd's own, never a create beside a foreign pod or on
unknown pods; and the happy paths do act (a test that cannot fail is a defect).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, SlurmdSpec, SlurmNodeObserved
from sunkd.domain.policy.slurmd import (
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    SeenPod,
    SlurmdNode,
    SlurmdNodeset,
    counts,
    is_own,
    plan,
    pod_name,
    revision,
    slurmd_args,
    spec_from_json,
    spec_json,
)
from sunkd.domain.slurmnode import slurm_busy, slurm_drained
from sunkd.domain.state import Phase

NODESET = SlurmdNodeset("gpu", "slurm", "uid-gpu", SlurmdSpec(image="slurmd:22.05"))
NOW = 10_000.0


def own(node: str, **kw: object) -> SeenPod:
    base = dict(namespace="slurm", name=pod_name("gpu", node), uid=f"u-{node}",
                nodeset_label="gpu", slurm_node=node, controller_kind=wk.NODESET_KIND,
                controller_uid="uid-gpu", started_at=NOW - 60)
    base.update(kw)
    return SeenPod(**base)  # type: ignore[arg-type]


def observed(state: str = "IDLE", flags: tuple[str, ...] = (), alloc: int = 0,
             slurmd_start_time: float = NOW - 59) -> SlurmNodeObserved:
    return SlurmNodeObserved(node="n1", state=state, flags=flags, cpus=4, alloc_cpus=alloc,
                             slurmd_start_time=slurmd_start_time)


def node(phase: Phase, pods: tuple[SeenPod, ...] | None = (), *, slurm: SlurmNodeObserved | None
         = None, taint: bool = True, name: str = "n1") -> SlurmdNode:
    return SlurmdNode(name, f"k-{name}", phase, slurm or observed(), taint, pods)


def verbs(*nodes: SlurmdNode, fresh: bool = True) -> list[str]:
    return [s.verb for s in plan(NODESET, nodes, NOW, sources_fresh=fresh)]


# ----------------------------------------------------------------------------- examples


def test_a_slurm_owned_node_without_its_pod_gets_one() -> None:
    (step,) = plan(NODESET, [node(Phase.SLURM)], NOW, sources_fresh=True)
    assert (step.verb, step.pod, step.k8s_node) == (VERB_SLURMD_CREATE, "slurm/gpu-n1", "k-n1")


def test_a_registered_pod_is_left_alone() -> None:
    (step,) = plan(NODESET, [node(Phase.SLURM, (own("n1"),))], NOW, sources_fresh=True)
    assert step.verb == "" and "registered" in step.reason


def test_a_lent_node_loses_its_pod_only_once_drained_idle_and_in_contact() -> None:
    pods = (own("n1"),)
    assert verbs(node(Phase.TO_K8S, pods, slurm=observed("ALLOCATED", ("DRAIN",), 4))) == [""]
    assert verbs(node(Phase.TO_K8S, pods, slurm=observed("IDLE"))) == [""]
    assert verbs(node(Phase.TO_K8S, pods, slurm=observed("IDLE", ("DRAIN", "NOT_RESPONDING")))) \
        == [""]
    assert verbs(node(Phase.TO_K8S, pods, slurm=observed("IDLE", ("COMPLETING", "DRAIN")))) \
        == [""]
    (step,) = plan(NODESET, [node(Phase.TO_K8S, pods, slurm=observed("IDLE", ("DRAIN",)))],
                   NOW, sources_fresh=True)
    assert (step.verb, step.uid) == (VERB_SLURMD_DELETE, "u-n1")


def test_reclaim_creates_only_after_every_foreign_pod_is_gone() -> None:
    foreign = SeenPod("team", "train-0", "u9")
    assert verbs(node(Phase.TO_SLURM, (foreign,))) == [""]
    assert verbs(node(Phase.TO_SLURM, (SeenPod("team", "train-0", "u9", phase="Succeeded"),))) \
        == [VERB_SLURMD_CREATE]
    assert verbs(node(Phase.TO_SLURM, ())) == [VERB_SLURMD_CREATE]
    assert verbs(node(Phase.TO_SLURM, (), taint=False)) == [""]


def test_an_impostor_is_foreign_never_deleted_and_blocks_a_create() -> None:
    impostor = own("n1", controller_uid="someone-else", uid="u-imp")
    assert not is_own(impostor, NODESET, "n1")
    assert verbs(node(Phase.SLURM, (impostor,))) == [""]
    assert verbs(node(Phase.TO_K8S, (impostor,), slurm=observed("IDLE", ("DRAIN",)))) == [""]
    for other in (own("n1", slurm_node="n2"), own("n1", nodeset_label="cpu"),
                  own("n1", controller_kind="ReplicaSet")):
        assert verbs(node(Phase.SLURM, (other,))) == [""]


def test_unknown_pods_held_unknown_and_stale_do_nothing() -> None:
    assert verbs(node(Phase.SLURM, None)) == [""]
    assert verbs(node(Phase.HELD)) == [""]
    assert verbs(node(Phase.UNKNOWN)) == [""]
    assert verbs(node(Phase.SLURM), fresh=False) == [""]
    assert verbs(node(Phase.TO_K8S, (own("n1"),), slurm=observed("IDLE", ("DRAIN",))),
                 fresh=False) == [""]


def test_a_terminating_pod_is_waited_for_and_not_deleted_twice() -> None:
    assert verbs(node(Phase.SLURM, (own("n1", deleting=True),))) == [""]
    assert verbs(node(Phase.TO_K8S, (own("n1", deleting=True),),
                      slurm=observed("IDLE", ("DRAIN",)))) == [""]


def test_unregistered_past_the_bound_is_reported() -> None:
    pod = own("n1", started_at=NOW - 500)
    down = observed("DOWN", ("NOT_RESPONDING",))
    (step,) = plan(NODESET, [node(Phase.SLURM, (pod,), slurm=down)], NOW, sources_fresh=True)
    assert step.verb == "" and "unregistered 500 s" in step.reason


def test_max_concurrent_startup_bounds_creates() -> None:
    nodeset = SlurmdNodeset("gpu", "slurm", "uid-gpu",
                            SlurmdSpec(image="i", max_concurrent_startup=2))
    nodes = [node(Phase.SLURM, name=f"n{i}") for i in range(5)]
    nodes[0] = node(Phase.SLURM, (own("n0", phase="Pending"),), name="n0")
    got = [s.verb for s in plan(nodeset, nodes, NOW, sources_fresh=True)]
    assert got == ["", VERB_SLURMD_CREATE, "", "", ""]


def test_args_carry_the_spec_and_round_trip() -> None:
    spec = SlurmdSpec(image="i", env=(Label("A", "1"),), volumes=('{"name":"x"}',),
                      args=("-f", "/etc/slurm.conf"), max_concurrent_startup=3)
    nodeset = SlurmdNodeset("gpu", "slurm", "uid-gpu", spec)
    (step,) = plan(nodeset, [node(Phase.SLURM)], NOW, sources_fresh=True)
    args = {label.key: label.value for label in slurmd_args(step, nodeset)}
    assert spec_from_json(args["spec"]) == spec and spec_from_json(spec_json(spec)) == spec
    assert args["revision"] == revision(spec) != revision(SlurmdSpec(image="j"))
    assert args["nodeset_uid"] == "uid-gpu" and args["pod"] == "slurm/gpu-n1"


def test_pod_names_are_dns_names_and_distinct() -> None:
    assert pod_name("gpu", "node1") == "gpu-node1"
    odd = {pod_name("gpu", n) for n in ("Node_1", "node-1", "NODE_1", "node.1")}
    assert len(odd) == 4
    assert all(n == n.lower() and len(n) <= 253 for n in odd)


def test_counts() -> None:
    nodes = [node(Phase.SLURM, (own("n1", revision=revision(NODESET.spec)),)),
             node(Phase.SLURM, (own("n2", phase="Pending", revision="old"),), name="n2",
                  slurm=observed("DOWN", ("NOT_RESPONDING",))),
             node(Phase.KUBERNETES, (), name="n3")]
    got = counts(NODESET, nodes)
    assert got == {"desired": 2, "current": 2, "ready": 1, "registered": 1, "updated": 1}
    unknown = [*nodes, node(Phase.SLURM, (own("n4"),), name="n4")]  # no revision reported
    assert "updated" not in counts(NODESET, unknown)


def test_the_revision_ignores_how_pods_are_rolled_out() -> None:
    """A DaemonSet's updateStrategy is not part of its template's hash: changing
    maxUnavailable (or the strategy, or maxConcurrentStartup) replaces no pod."""
    import dataclasses
    spec = NODESET.spec
    for change in ({"max_unavailable": "50%"}, {"update_strategy": "OnDelete"},
                   {"max_concurrent_startup": 2}):
        assert revision(dataclasses.replace(spec, **change)) == revision(spec)  # type: ignore[arg-type]
    assert revision(dataclasses.replace(spec, env=(Label("A", "1"),))) != revision(spec)


# ----------------------------------------------------------------------- adversaries

STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "COMPLETING", "DOWN", "UNKNOWN",
                          "FUTURE", "PLANNED", "WEIRD"])
FLAGS = st.lists(st.sampled_from(["DRAIN", "UNDRAIN", "NOT_RESPONDING", "COMPLETING", "FAIL",
                                  "POWERED_DOWN", "INVALID_REG"]), unique=True, max_size=3)
OBSERVED = st.none() | st.builds(
    lambda s, f, a: SlurmNodeObserved(node="n", state=s, flags=tuple(sorted(f)), cpus=4,
                                      alloc_cpus=a), STATES, FLAGS, st.sampled_from([0, 0, 2]))


@st.composite
def pods_on(draw: st.DrawFn, name: str) -> tuple[SeenPod, ...] | None:
    if draw(st.integers(0, 9)) == 0:
        return None  # unknown
    kinds = draw(st.lists(st.sampled_from(
        ["own", "impostor", "other-node", "other-nodeset", "foreign", "daemonish"]),
        max_size=3))
    pods = []
    for index, kind in enumerate(kinds):
        phase = draw(st.sampled_from(["Pending", "Running", "Running", "Succeeded", "Failed",
                                      "Unknown"]))
        deleting = draw(st.booleans())
        base = own(name, name=f"p{index}", uid=f"u{index}", phase=phase, deleting=deleting)
        if kind == "impostor":
            base = own(name, name=f"p{index}", uid=f"u{index}", phase=phase,
                       controller_uid=draw(st.sampled_from(["", "other", "UID-GPU"])))
        elif kind == "other-node":
            base = own(name, name=f"p{index}", uid=f"u{index}", phase=phase, slurm_node="zz")
        elif kind == "other-nodeset":
            base = own(name, name=f"p{index}", uid=f"u{index}", phase=phase,
                       nodeset_label="cpu")
        elif kind in ("foreign", "daemonish"):
            base = SeenPod("team", f"p{index}", f"u{index}", phase=phase, deleting=deleting)
        pods.append(base)
    return tuple(pods)


@st.composite
def worlds(draw: st.DrawFn) -> list[SlurmdNode]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        name = f"n{i}"
        out.append(SlurmdNode(name, draw(st.sampled_from([f"k{i}", f"k{i}", None])),
                              draw(st.sampled_from(list(Phase))), draw(OBSERVED),
                              draw(st.booleans()), draw(pods_on(name))))
    return out


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.booleans())
def test_never_a_delete_under_a_job_nor_a_create_beside_a_foreign_pod(
    nodes: list[SlurmdNode], fresh: bool
) -> None:
    by_name = {n.name: n for n in nodes}
    for step in plan(NODESET, nodes, NOW, sources_fresh=fresh):
        target = by_name[step.node]
        assert step.verb in ("", VERB_SLURMD_CREATE, VERB_SLURMD_DELETE)
        if step.verb:
            assert fresh and target.pods is not None and target.k8s_node is not None
            assert step.k8s_node == target.k8s_node
        if step.verb == VERB_SLURMD_DELETE:
            assert target.slurm is not None and not slurm_busy(target.slurm)
            assert slurm_drained(target.slurm)
            assert target.phase in (Phase.TO_K8S, Phase.KUBERNETES)
            (pod,) = [p for p in target.pods or () if p.key == step.pod]
            assert is_own(pod, NODESET, target.name) and pod.uid == step.uid
            assert not pod.deleting
        if step.verb == VERB_SLURMD_CREATE:
            assert target.phase in (Phase.SLURM, Phase.TO_SLURM) and target.owner_taint
            running = [p for p in target.pods or () if p.phase not in ("Succeeded", "Failed")]
            assert running == [], running  # no foreign pod, no impostor, no pod of ours
            assert not any(is_own(p, NODESET, target.name) for p in target.pods or ())


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_the_plan_is_deterministic_and_one_create_per_node(nodes: list[SlurmdNode]) -> None:
    first = plan(NODESET, nodes, NOW, sources_fresh=True)
    assert first == plan(NODESET, list(reversed(nodes)), NOW, sources_fresh=True)
    creates = [s.node for s in first if s.verb == VERB_SLURMD_CREATE]
    assert len(creates) == len(set(creates))
