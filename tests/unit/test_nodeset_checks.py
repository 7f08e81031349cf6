"""The per-Nodeset slurm.conf checks (`sunkd/slurm/nodeset_checks.py`) and the doctor's
Nodeset half (`sunkd/cli/doctor_nodesets.py`): each check from what was read, unknown when
a read failed (never ok), and the exact lines to add."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sunkd.cli.doctor_nodesets import SlurmReads, nodeset_facts, nodesets_report, render
from sunkd.slurm.nodeset_checks import (
    NodesetFacts,
    NodesetNode,
    Partition,
    check_conf_port,
    check_kill_wait,
    check_nodes_defined,
    check_partition,
    controller_checks,
    nodeset_findings,
    parse_show_partitions,
)

# `scontrol show partition -o` from Slurm 22.05.8 (the test harness's cluster, trimmed).
SHOWN = (
    "PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED Nodes=pz1 "
    "State=UP TotalCPUs=2 TotalNodes=1 TRES=cpu=2,mem=1000M,node=1,billing=2\n"
    "PartitionName=gpu AllowGroups=ALL Default=NO Nodes=pz[2-3] State=UP TotalNodes=2 "
    "TRES=cpu=4,mem=2000M,node=2,billing=4\n"
    "PartitionName=dyn AllowGroups=ALL Default=NO NodeSets=ns1 Nodes=(null) State=UP "
    "TotalCPUs=0 TotalNodes=0 TRES=(null)\n"
)

CONFIG = {"ReturnToService": "1", "SlurmctldParameters": "(null)", "MaxNodeCount": "3",
          "KillWait": "30 sec", "SLURM_VERSION": "22.05.8", "TreeWidth": "50"}


def nodes(*names: str) -> tuple[NodesetNode, ...]:
    return tuple(NodesetNode(n, f"k8s-{n}", f"10.0.0.{i}") for i, n in enumerate(names, 1))


def static(**kwargs: Any) -> NodesetFacts:
    base: dict[str, Any] = {"pool": "slurm/gpu", "name": "gpu", "partitions": ("gpu",),
                            "nodes": nodes("pz2", "pz3")}
    return NodesetFacts(**(base | kwargs))


def by_check(findings: list[Any]) -> dict[str, Any]:
    return {f.check: f for f in findings}


def test_show_partition_parses_nodes_nodesets_and_null() -> None:
    parts = parse_show_partitions(SHOWN)
    assert parts["gpu"] == Partition("gpu", ("pz2", "pz3"), (), "pz[2-3]")
    assert parts["dyn"] == Partition("dyn", (), ("ns1",), "")
    assert parts["debug"].nodes == ("pz1",)
    assert parse_show_partitions("No partitions in the system\n") == {}


def test_a_static_nodeset_whose_partition_holds_its_nodes_is_ok() -> None:
    finding = check_partition(static(), "gpu", parse_show_partitions(SHOWN))
    assert finding.ok is True and finding.status == "ok" and finding.add is None


def test_a_missing_partition_gets_its_line_with_the_nodes() -> None:
    finding = check_partition(static(partitions=("batch",)), "batch",
                              parse_show_partitions(SHOWN))
    assert finding.status == "missing" and finding.found == "absent"
    assert finding.add == "PartitionName=batch Nodes=pz[2-3] State=UP"


def test_a_partition_without_some_nodes_gets_the_whole_new_line() -> None:
    finding = check_partition(static(nodes=nodes("pz1", "pz2", "pz3", "pz7")), "gpu",
                              parse_show_partitions(SHOWN))
    assert finding.ok is False
    assert finding.found == "pz[2-3] (without pz[1,7])"
    assert finding.add == "PartitionName=gpu Nodes=pz[1-3,7] State=UP"


def test_a_partition_of_a_nodeset_with_no_node_yet_is_a_nodeset_line() -> None:
    finding = check_partition(static(nodes=(), partitions=("batch",)), "batch", {})
    assert finding.add == "NodeSet=gpu Feature=gpu\nPartitionName=batch Nodes=gpu State=UP"
    assert "Feature=gpu" in finding.why


def test_dynamic_registration_needs_a_nodeset_in_the_partition() -> None:
    parts = parse_show_partitions(SHOWN)
    dynamic = static(name="ns1", registration="Dynamic", partitions=("dyn", "gpu", "new"))
    assert check_partition(dynamic, "dyn", parts).ok is True
    kept = check_partition(dynamic, "gpu", parts)
    assert kept.ok is False
    assert kept.add == "NodeSet=ns1 Feature=ns1\nPartitionName=gpu Nodes=pz[2-3],ns1 State=UP"
    assert check_partition(dynamic, "new", parts).add == \
        "NodeSet=ns1 Feature=ns1\nPartitionName=new Nodes=ns1 State=UP"


def test_unread_partitions_or_nodes_are_unknown_never_ok() -> None:
    assert check_partition(static(), "gpu", None).status == "unknown"
    unread = check_partition(static(nodes=None), "gpu", parse_show_partitions(SHOWN))
    assert unread.ok is None and unread.status == "unknown"
    assert check_nodes_defined(static(), None).status == "unknown"  # type: ignore[union-attr]
    assert check_kill_wait(static(), None).status == "unknown"
    findings = controller_checks(static(registration="Dynamic"), None, None)
    assert {f.check: f.status for f in findings} == {
        "ReturnToService": "unknown", "configless": "unknown", "MaxNodeCount": "unknown"}


def test_static_nodes_slurm_does_not_define_get_their_nodename_lines() -> None:
    facts = static(nodes=(*nodes("pz2"), NodesetNode("gpu-9", "k8s-gpu-9", None)))
    finding = check_nodes_defined(facts, ["pz1", "pz2", "pz3"])
    assert finding is not None and finding.ok is False
    assert finding.add == "NodeName=gpu-9 NodeHostname=k8s-gpu-9"
    assert check_nodes_defined(static(), ["pz1", "pz2", "pz3"]).ok  # type: ignore[union-attr]
    assert check_nodes_defined(static(registration="Dynamic"), []) is None


def test_return_to_service_always_configless_and_room_by_registration() -> None:
    names = ["pz1", "pz2", "pz3"]
    plain = by_check(controller_checks(static(), CONFIG, names))
    assert set(plain) == {"ReturnToService"} and plain["ReturnToService"].ok
    configless = by_check(controller_checks(static(conf_server="ctld:6817"), CONFIG, names))
    assert configless["configless"].add == "SlurmctldParameters=enable_configless"
    dynamic = by_check(controller_checks(
        static(registration="Dynamic", nodes=nodes("d1", "d2")), CONFIG, names))
    assert set(dynamic) == {"ReturnToService", "configless", "MaxNodeCount", "TreeWidth"}
    assert dynamic["MaxNodeCount"].add == "MaxNodeCount=5"  # 3 known + 2 to come
    rts0 = by_check(controller_checks(static(), CONFIG | {"ReturnToService": "0"}, names))
    assert rts0["ReturnToService"].add == "ReturnToService=1"
    unread = by_check(controller_checks(static(registration="Dynamic"), CONFIG, None))
    assert unread["MaxNodeCount"].status == "unknown"


def test_kill_wait_must_fit_in_the_grace_period() -> None:
    assert check_kill_wait(static(grace_seconds=60), CONFIG).ok is True
    short = check_kill_wait(static(grace_seconds=10), CONFIG)
    assert short.ok is False and short.add == "KillWait=10"
    assert check_kill_wait(static(), {}).status == "unknown"


def nodeset(spec: dict[str, Any], name: str = "gpu") -> dict[str, Any]:
    return {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": name, "namespace": "slurm", "uid": "u1"}, "spec": spec}


def node(name: str, labels: dict[str, str], ip: str | None = None) -> dict[str, Any]:
    status = {"addresses": [{"type": "Hostname", "address": name}]
              + ([{"type": "InternalIP", "address": ip}] if ip else [])}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


SLURMD = {"image": "slurmd:22.05", "terminationGracePeriodSeconds": 40}


def test_facts_select_nodes_and_take_the_slurm_name_rule() -> None:
    spec = {"nodeSelector": {"pool": "gpu"}, "slurm": {"partitions": ["gpu"],
            "nodeNameLabel": "slurm-name"}, "slurmd": SLURMD}
    facts = nodeset_facts(nodeset(spec), [
        node("k1", {"pool": "gpu", "slurm-name": "pz2"}, "10.1.0.1"),
        node("k2", {"pool": "gpu"}),
        node("k3", {"pool": "cpu"}),
    ])
    assert isinstance(facts, NodesetFacts)
    assert facts.nodes == (NodesetNode("k2", "k2", None), NodesetNode("pz2", "k1", "10.1.0.1"))
    assert (facts.pool, facts.name, facts.grace_seconds) == ("slurm/gpu", "gpu", 40)
    assert nodeset_facts(nodeset({"nodeSelector": {"pool": "gpu"}}), []) is None
    unread = nodeset_facts(nodeset(spec), None)
    assert isinstance(unread, NodesetFacts) and unread.nodes is None
    malformed = nodeset_facts(nodeset(spec | {"slurmd": {"image": ""}}), [])
    assert isinstance(malformed, str) and "spec.slurmd.image" in malformed


def test_the_report_fails_on_missing_or_unknown_and_prints_the_lines() -> None:
    spec = {"nodeSelector": {"pool": "gpu"}, "slurm": {"partitions": ["gpu", "batch"]},
            "slurmd": SLURMD}
    kube_nodes = [node("pz2", {"pool": "gpu"}, "10.1.0.2"),
                  node("pz9", {"pool": "gpu"}, "10.1.0.9")]
    reads = SlurmReads(CONFIG | {"KillWait": "2 sec"}, parse_show_partitions(SHOWN),
                       ["pz1", "pz2", "pz3"])
    report = nodesets_report([nodeset(spec), nodeset({"nodeSelector": {"a": "b"}}, "plain")],
                             kube_nodes, reads)
    assert report["ok"] is False and len(report["nodesets"]) == 1
    entry = report["nodesets"][0]
    assert entry["nodes"] == ["pz2", "pz9"]
    status = {f["check"]: (f["status"], f["add"]) for f in entry["findings"]}
    assert status == {
        "ReturnToService": ("ok", None),
        "KillWait": ("ok", None),
        "NodeName lines": ("missing", "NodeName=pz9 NodeAddr=10.1.0.9"),
        "partition gpu": ("missing", "PartitionName=gpu Nodes=pz[2-3,9] State=UP"),
        "partition batch": ("missing", "PartitionName=batch Nodes=pz[2,9] State=UP"),
    }
    text = "\n".join(render(report))
    assert "  slurm/gpu (Static, 2 node(s))" in text
    assert "    MISSING  NodeName lines = 1 of 2 not in Slurm: " in text
    assert "               add: PartitionName=gpu Nodes=pz[2-3,9] State=UP" in text
    unread = nodesets_report([nodeset(spec)], kube_nodes,
                             SlurmReads(None, None, None, ("scontrol is not installed",)))
    assert unread["ok"] is False
    assert {f["status"] for f in unread["nodesets"][0]["findings"]} == {"unknown"}
    assert "  read failed: scontrol is not installed" in render(unread)
    fine = nodesets_report([nodeset(spec | {"slurm": {"partitions": ["gpu"]}})],
                           kube_nodes[:1], reads)
    assert fine["ok"] is True, fine
    assert nodesets_report([], [], reads) == {"ok": True, "nodesets": [], "read_errors": []}


names = st.lists(st.from_regex(r"[a-z]{1,3}[0-9]{0,2}", fullmatch=True), max_size=6)


@given(st.text(), names, names, st.sampled_from(["Static", "Dynamic"]), st.booleans())
def test_any_input_gives_findings_and_every_missing_one_says_what_to_add(
        shown: str, wanted: list[str], known: list[str], registration: str,
        read: bool) -> None:
    facts = static(registration=registration, nodes=nodes(*dict.fromkeys(wanted)),
                   partitions=("gpu", "x"))
    findings = nodeset_findings(facts, config=CONFIG if read else None,
                                partitions=parse_show_partitions(shown) if read else None,
                                slurm_nodes=known if read else None)
    for finding in findings:
        assert finding.ok is not None or not read or finding.check.startswith("partition"), \
            finding
        assert finding.ok is not False or finding.add, finding
        if not read:
            assert finding.ok is None, finding


def test_a_dynamic_nodeset_is_checked_for_the_dynamic_prerequisites() -> None:
    # Dynamic registration is accepted now: the doctor checks what it needs (configless,
    # MaxNodeCount, TreeWidth before 23.02, a NodeSet in each partition) instead of
    # reporting the Nodeset malformed.
    spec = {"nodeSelector": {"pool": "gpu"}, "slurm": {"partitions": ["dyn", "gpu"]},
            "slurmd": SLURMD | {"registration": "Dynamic", "confServer": "ctld:6817"}}
    kube_nodes = [node("d1", {"pool": "gpu"}, "10.1.0.1"), node("d2", {"pool": "gpu"})]
    facts = nodeset_facts(nodeset(spec, "ns1"), kube_nodes)
    assert isinstance(facts, NodesetFacts) and facts.registration == "Dynamic"
    reads = SlurmReads(CONFIG | {"KillWait": "2 sec"}, parse_show_partitions(SHOWN),
                       ["pz1", "pz2", "pz3"])
    report = nodesets_report([nodeset(spec, "ns1")], kube_nodes, reads)
    status = {f["check"]: (f["status"], f["add"]) for f in report["nodesets"][0]["findings"]}
    assert status["configless"] == ("missing", "SlurmctldParameters=enable_configless")
    assert status["MaxNodeCount"] == ("missing", "MaxNodeCount=5")  # 3 known + d1, d2
    assert status["TreeWidth"] == ("missing", "TreeWidth=65533")  # 22.05
    assert status["partition dyn"][0] == "ok"  # NodeSets=ns1
    assert status["partition gpu"] == ("missing", "NodeSet=ns1 Feature=ns1\n"
                                       "PartitionName=gpu Nodes=pz[2-3],ns1 State=UP")
    assert "NodeName lines" not in status
    wrong = nodeset_facts(nodeset(spec | {"slurmd": SLURMD | {"registration": "Dynamic"}}),
                          kube_nodes)
    assert isinstance(wrong, str) and "spec.slurmd.confServer" in wrong


def test_a_dynamic_conf_with_port_is_refused_by_slurmd_before_23_11() -> None:
    dynamic = static(registration="Dynamic", conf="Weight=5 port=6820")
    old = check_conf_port(dynamic, CONFIG)  # 22.05.8
    assert old is not None and old.status == "missing" and "Port=" in old.why
    new = check_conf_port(dynamic, CONFIG | {"SLURM_VERSION": "23.11.1"})
    assert new is not None and new.ok is True
    assert check_conf_port(dynamic, None) is not None
    assert check_conf_port(dynamic, None).status == "unknown"  # type: ignore[union-attr]
    assert check_conf_port(static(registration="Dynamic", conf="Weight=5"), CONFIG) is None
    assert check_conf_port(static(conf="Port=1"), CONFIG) is None  # Static: no --conf
    findings = nodeset_findings(dynamic, config=CONFIG, partitions={}, slurm_nodes=[])
    assert "conf Port=" in {f.check for f in findings}
