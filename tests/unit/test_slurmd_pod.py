"""The slurmd pod rendered from spec.slurmd (kubernetes/slurmd_pod.py): bound to its node,
tolerating the owner taint, on the host network, node-critical, and recognised as sunkd's
own by the plan when read back, while a copy with another owner is not."""

from __future__ import annotations

import json

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, SlurmdSpec
from sunkd.domain.policy.slurmd import SlurmdNodeset, is_own, revision
from sunkd.kubernetes.slurmd_pod import command, dynamic_conf, render, seen_pod

SPEC = SlurmdSpec(image="slurmd:22.05", image_pull_policy="Never", conf_server="ctl:6817",
                  args=("-f", "/etc/slurm/slurm.conf"), env=(Label("A", "1"),),
                  requests=(Label("cpu", "500m"),), volumes=('{"hostPath":{"path":"/x"},'
                                                             '"name":"x"}',),
                  volume_mounts=('{"mountPath":"/x","name":"x"}',),
                  termination_grace_seconds=90)
NODESET = SlurmdNodeset("gpu", "slurm", "uid-gpu", SPEC)


def pod(slurm_node: str = "node1") -> dict[str, object]:
    return render(SPEC, nodeset="gpu", namespace="slurm", nodeset_uid="uid-gpu",
                  slurm_node=slurm_node, k8s_node="k8s-1", name="gpu-node1")


def test_the_pod_runs_static_slurmd_bound_to_its_node() -> None:
    obj = pod()
    spec = obj["spec"]
    assert isinstance(spec, dict)
    assert spec["nodeName"] == "k8s-1" and spec["hostNetwork"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["terminationGracePeriodSeconds"] == 90
    assert spec["tolerations"] == [{"key": wk.TAINT_OWNER, "operator": "Equal",
                                    "value": wk.OWNER_SLURM, "effect": "NoSchedule"}]
    (container,) = spec["containers"]
    assert container["command"] == ["slurmd", "-D", "-N", "node1", "--conf-server", "ctl:6817",
                                    "-f", "/etc/slurm/slurm.conf"]
    assert container["env"] == [{"name": "A", "value": "1"}]
    assert container["resources"] == {"requests": {"cpu": "500m"}}
    assert container["volumeMounts"] == [{"mountPath": "/x", "name": "x"}]
    assert spec["volumes"] == [{"hostPath": {"path": "/x"}, "name": "x"}]
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    assert meta["ownerReferences"] == [{"apiVersion": wk.API_VERSION, "kind": "Nodeset",
                                        "name": "gpu", "uid": "uid-gpu", "controller": True}]
    assert meta["annotations"][wk.ANNOTATION_SLURMD_REVISION] == revision(SPEC)
    json.dumps(obj)  # plain JSON


def test_read_back_it_is_own_and_a_copy_with_another_owner_is_not() -> None:
    obj = pod()
    obj["metadata"]["uid"] = "p1"  # type: ignore[index]
    assert is_own(seen_pod(obj), NODESET, "node1")
    assert not is_own(seen_pod(obj), NODESET, "node2")
    obj["metadata"]["ownerReferences"][0]["uid"] = "another"  # type: ignore[index]
    assert not is_own(seen_pod(obj), NODESET, "node1")


def test_a_slurm_name_that_is_no_label_value_is_still_annotated() -> None:
    obj = pod("Node_1.a-")
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    assert wk.LABEL_SLURMD_NODE not in meta["labels"]
    assert meta["annotations"][wk.ANNOTATION_SLURMD_NODE] == "Node_1.a-"
    assert command(SlurmdSpec(image="i"), "n", "gpu") == ["slurmd", "-D", "-N", "n"]


def test_a_dynamic_pod_registers_with_the_nodesets_feature_first() -> None:
    dynamic = SlurmdSpec(image="i", registration="Dynamic", conf_server="ctl:6817",
                         conf="Weight=5 Feature=a100,gpu Features=ib RealMemory=1000",
                         args=("-v",))
    assert command(dynamic, "node1", "gpu") == [
        "slurmd", "-D", "-Z", "-N", "node1",
        "--conf", "Features=gpu,a100,ib Weight=5 RealMemory=1000",
        "--conf-server", "ctl:6817", "-v"]
    # The site's conf naming the Nodeset's feature again does not repeat it.
    plain = SlurmdSpec(image="i", registration="Dynamic", conf_server="c", conf="features=gpu")
    assert dynamic_conf(plain, "gpu") == "Features=gpu"
    assert dynamic_conf(SlurmdSpec(image="i", registration="Dynamic", conf_server="c"),
                        "cpu") == "Features=cpu"
    (container,) = render(dynamic, nodeset="gpu", namespace="slurm", nodeset_uid="u",
                          slurm_node="node1", k8s_node="k", name="gpu-node1")[
        "spec"]["containers"]  # type: ignore[index]
    assert container["command"][:3] == ["slurmd", "-D", "-Z"]
