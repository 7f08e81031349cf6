"""`sunkd doctor`'s Nodeset checks as an operator runs them: the Nodesets and Nodes from
the API emulator, slurmctld and slurmrestd real (each Slurm generation). A Nodeset whose
slurm.conf lines are missing gets them printed; those very lines, put in slurm.conf, are
taken by slurmctld and the doctor then passes; with slurmctld gone every check is unknown,
never ok."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sunkd_testbed.kubeapi import KubeAPIEmulator
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
NODES = "dn[1-2]"


async def run_doctor(tmp_path: Path, kubeconfig: Path, cluster: SlurmCluster,
                     *, json_out: bool = True) -> tuple[int, str]:
    config = tmp_path / "sunkd.toml"
    config.write_text(f'[slurm]\nurl = "{cluster.rest_url}"\n'
                      f'jwt_key_file = "{cluster.jwt_key_path}"\n'
                      f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n')
    # scontrol as a site's login node has it (SLURM_CONF, the root's wrappers on PATH).
    env = {k: v for k, v in cluster.env.items() if not k.startswith("SUNKD_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sunkd", "--config", str(config), "doctor",
        *(["--json"] if json_out else []), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, out.decode()


def objects(emulator: KubeAPIEmulator) -> None:
    emulator.create(yaml.safe_load((REPO / "manifests/crds/nodeset.yaml").read_text()))
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "slurm"}})
    for name in ("dn1", "dn2", "dn3"):
        emulator.create({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "labels": {"pool": "gpu"}},
                         "status": {"addresses": [{"type": "InternalIP",
                                                   "address": "127.0.0.1"}]}})
    emulator.create({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": "other", "labels": {"pool": "cpu"}}})
    emulator.create({
        "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
        "metadata": {"name": "gpu", "namespace": "slurm"},
        "spec": {"nodeSelector": {"pool": "gpu"}, "slurm": {"partitions": ["debug", "gpu"]},
                 "slurmd": {"image": "slurmd:local", "confServer": "127.0.0.1:6817",
                            "terminationGracePeriodSeconds": 10}}})
    # A Nodeset without spec.slurmd: sunkd runs no pods for it, nothing to check.
    emulator.create({"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
                     "metadata": {"name": "plain", "namespace": "slurm"},
                     "spec": {"nodeSelector": {"pool": "cpu"},
                              "slurm": {"partitions": ["debug"]}}})


def findings(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [entry] = report["nodesets"]["nodesets"]
    assert entry["nodeset"] == "slurm/gpu" and entry["registration"] == "Static"
    assert entry["nodes"] == ["dn1", "dn2", "dn3"]
    return {f["check"]: f for f in entry["findings"]}


@pytest.mark.parametrize("version", [pytest.param(v, id=f"slurm-{v}")
                                     for v in slurm_test_versions()])
async def test_doctor_prints_the_lines_a_nodeset_needs_and_slurm_takes_them(
        tmp_path: Path, version: str) -> None:
    async with KubeAPIEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        objects(emulator)
        for cluster in start_cluster(NODES, version=version, return_to_service=1):
            code, out = await run_doctor(tmp_path, kubeconfig, cluster)
            _, text = await run_doctor(tmp_path, kubeconfig, cluster, json_out=False)
        report = json.loads(out)
        assert code == 1 and report["ok"] is False, out
        by = findings(report)
        assert {c: f["status"] for c, f in by.items()} == {
            "ReturnToService": "ok", "KillWait": "ok", "configless": "missing",
            "NodeName lines": "missing", "partition debug": "missing",
            "partition gpu": "missing"}, by
        assert by["configless"]["add"] == "SlurmctldParameters=enable_configless"
        assert by["NodeName lines"]["add"] == "NodeName=dn3 NodeAddr=127.0.0.1"
        assert by["partition debug"]["found"] == "dn[1-2] (without dn3)"
        assert by["partition debug"]["add"] == "PartitionName=debug Nodes=dn[1-3] State=UP"
        assert by["partition gpu"]["add"] == "PartitionName=gpu Nodes=dn[1-3] State=UP"
        # The table says the same, line for line.
        assert "  slurm/gpu (Static, 3 node(s))" in text
        assert "    ok       ReturnToService = 1" in text
        assert "               add: PartitionName=gpu Nodes=dn[1-3] State=UP" in text
        assert "               add: NodeName=dn3 NodeAddr=127.0.0.1" in text
        # The advice into slurm.conf. The harness writes the node and partition lines
        # itself (a node's line with its slurmd's port, partitions after the nodes): take
        # those suggestions through it, every other line as given.
        adds = [line for f in by.values() if f["add"] for line in f["add"].splitlines()]
        partitions = dict(re.fullmatch(r"PartitionName=(\S+) Nodes=(\S+) State=UP", line)
                          .groups() for line in adds  # type: ignore[union-attr]
                          if line.startswith("PartitionName="))
        added = [line.split()[0].removeprefix("NodeName=") for line in adds
                 if line.startswith("NodeName=")]
        assert added == ["dn3"]
        others = [line for line in adds if not line.startswith(("PartitionName=",
                                                                  "NodeName="))]
        for cluster in start_cluster("dn[1-3]", version=version, return_to_service=1,
                                     partitions=partitions, extra_conf=others):
            code, out = await run_doctor(tmp_path, kubeconfig, cluster)
            assert code == 0, out
            assert {f["status"] for f in findings(json.loads(out)).values()} == {"ok"}
        # slurmctld and slurmrestd gone: every check unknown, never ok.
        code, out = await run_doctor(tmp_path, kubeconfig, cluster)
        report = json.loads(out)
        assert code == 1
        assert {f["status"] for f in findings(report).values()} == {"unknown"}, out
        errors = report["nodesets"]["read_errors"]
        assert any("slurmrestd" in e for e in errors) and len(errors) == 3, errors



@pytest.mark.parametrize("version", [pytest.param(v, id=f"slurm-{v}")
                                     for v in slurm_test_versions()])
async def test_doctor_checks_a_dynamic_nodeset_and_slurm_takes_its_lines(
        tmp_path: Path, version: str) -> None:
    """A Dynamic Nodeset (accepted since Dynamic registration is built): the doctor asks
    for configless, room in MaxNodeCount for its two nodes (and TreeWidth before 23.02),
    and a NodeSet of its feature in its partition; slurmctld takes exactly those lines."""
    async with KubeAPIEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create(yaml.safe_load((REPO / "manifests/crds/nodeset.yaml").read_text()))
        emulator.create({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": "slurm"}})
        for name in ("dy1", "dy2"):
            emulator.create({"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": name, "labels": {"pool": "dyn"}}})
        emulator.create({
            "apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": "dyn", "namespace": "slurm"},
            "spec": {"nodeSelector": {"pool": "dyn"}, "slurm": {"partitions": ["dyn"]},
                     "slurmd": {"image": "slurmd:local", "registration": "Dynamic",
                                "confServer": "127.0.0.1:6817", "conf": "Weight=5",
                                "terminationGracePeriodSeconds": 10}}})
        for cluster in start_cluster("st1", version=version, return_to_service=1):
            code, out = await run_doctor(tmp_path, kubeconfig, cluster)
        report = json.loads(out)
        assert code == 1, out
        [entry] = report["nodesets"]["nodesets"]
        assert entry["registration"] == "Dynamic" and entry["nodes"] == ["dy1", "dy2"]
        by = {f["check"]: f for f in entry["findings"]}
        assert "NodeName lines" not in by  # a dynamic node has none
        assert by["configless"]["add"] == "SlurmctldParameters=enable_configless"
        assert by["MaxNodeCount"]["status"] == "missing"
        assert by["MaxNodeCount"]["add"] == "MaxNodeCount=3"  # st1 + dy1, dy2
        assert by["partition dyn"]["add"] == ("NodeSet=dyn Feature=dyn\n"
                                              "PartitionName=dyn Nodes=dyn State=UP")
        missing = [f for f in by.values() if f["status"] != "ok"]
        assert all(f["add"] for f in missing), missing
        adds = [line for f in missing for line in f["add"].splitlines()]
        others = [line for line in adds if not line.startswith("PartitionName=")]
        for cluster in start_cluster("st1", version=version, return_to_service=1,
                                     partitions={"debug": "st1", "dyn": "dyn"},
                                     extra_conf=others):
            code, out = await run_doctor(tmp_path, kubeconfig, cluster)
            assert code == 0, out
            [entry] = json.loads(out)["nodesets"]["nodesets"]
            assert {f["status"] for f in entry["findings"]} == {"ok"}, entry
