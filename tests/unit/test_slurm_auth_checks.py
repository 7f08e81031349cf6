"""`sunkd doctor`'s auth checks (`sunkd/slurm/auth_checks.py`): AuthType/CredType as a
Nodeset's `spec.slurmd.auth` needs them, Slurm 23.11+ for auth/slurm, munged's socket for
sunkd's sidecar; unknown (never ok) when slurmctld's configuration was not read."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sunkd.cli.doctor_nodesets import SlurmReads, nodeset_facts, nodesets_report, render
from sunkd.slurm.auth_checks import auth_findings
from sunkd.slurm.nodeset_checks import NodesetFacts, parse_show_partitions

# `scontrol show config` of the test harness's clusters, trimmed.
MUNGE_2205 = {"AuthType": "auth/munge", "CredType": "cred/munge", "SLURM_VERSION": "22.05.8",
              "AuthInfo": "socket=/tmp/sunkd-slurm-x/munge/run/munge.socket.2"}
SLURM_2411 = {"AuthType": "auth/slurm", "CredType": "cred/slurm", "SLURM_VERSION": "24.11.5",
              "AuthInfo": "(null)"}


def status(findings: list[Any]) -> dict[str, tuple[str, str | None]]:
    return {f.check: (f.status, f.as_dict()["add"]) for f in findings}


def test_munge_needs_auth_and_cred_munge_and_the_sidecar_socket() -> None:
    assert status(auth_findings("munge", MUNGE_2205)) == {
        "AuthType": ("ok", None), "CredType": ("ok", None)}
    found = status(auth_findings("munge", MUNGE_2205, munge_socket_dir="/run/munge"))
    assert found["AuthInfo socket"] == ("missing", "AuthInfo=socket=/run/munge/munge.socket.2")
    default = MUNGE_2205 | {"AuthInfo": "(null)"}
    assert status(auth_findings("munge", default, munge_socket_dir="/run/munge"))[
        "AuthInfo socket"] == ("ok", None)
    var_run = MUNGE_2205 | {"AuthInfo": "ttl=60,socket=/var/run/munge/munge.socket.2"}
    assert status(auth_findings("munge", var_run, munge_socket_dir="/run/munge"))[
        "AuthInfo socket"] == ("ok", None)
    elsewhere = status(auth_findings("munge", default, munge_socket_dir="/run/m"))
    assert elsewhere["AuthInfo socket"] == ("missing", "AuthInfo=socket=/run/m/munge.socket.2")
    assert status(auth_findings("munge", SLURM_2411)) == {
        "AuthType": ("missing", "AuthType=auth/munge"),
        "CredType": ("missing", "CredType=cred/munge")}


def test_auth_slurm_needs_its_types_and_slurm_23_11() -> None:
    assert status(auth_findings("slurm", SLURM_2411)) == {
        "AuthType": ("ok", None), "CredType": ("ok", None), "Slurm version": ("ok", None)}
    old = status(auth_findings("slurm", MUNGE_2205))
    assert old == {"AuthType": ("missing", "AuthType=auth/slurm"),
                   "CredType": ("missing", "CredType=cred/slurm"),
                   "Slurm version": ("missing", None)}
    mixed = status(auth_findings("slurm", SLURM_2411 | {"CredType": "cred/munge"}))
    assert mixed["CredType"] == ("missing", "CredType=cred/slurm")
    assert status(auth_findings("slurm", {"SLURM_VERSION": "23.11.0", "AuthType": "auth/slurm",
                                          "CredType": "cred/slurm"}))["Slurm version"][0] == "ok"


def test_unread_is_unknown_never_ok() -> None:
    for kind in ("munge", "slurm"):
        assert {f.status for f in auth_findings(kind, None)} == {"unknown"}
    assert {f.status for f in auth_findings("slurm", {})} == {"unknown"}


def nodeset(auth: Any) -> dict[str, Any]:
    slurmd: dict[str, Any] = {"image": "slurmd:24.11"}
    if auth is not None:
        slurmd["auth"] = auth
    return {"apiVersion": "sunkd.io/v1alpha1", "kind": "Nodeset",
            "metadata": {"name": "gpu", "namespace": "slurm", "uid": "u1"},
            "spec": {"nodeSelector": {"pool": "gpu"}, "slurm": {"partitions": ["gpu"]},
                     "slurmd": slurmd}}


def test_the_doctor_checks_auth_only_when_the_nodeset_says_it() -> None:
    plain = nodeset_facts(nodeset(None), [])
    assert isinstance(plain, NodesetFacts) and plain.auth is None
    sidecar = nodeset_facts(nodeset({"keySecret": {"name": "k"}}), [])
    assert isinstance(sidecar, NodesetFacts)
    assert (sidecar.auth, sidecar.munge_socket_dir) == ("munge", "/run/munge")
    config = SLURM_2411 | {"ReturnToService": "1", "KillWait": "30 sec"}
    reads = SlurmReads(config, parse_show_partitions("PartitionName=gpu Nodes=(null)\n"), [])
    report = nodesets_report([nodeset({"type": "munge", "keySecret": {"name": "k"}})], [],
                             reads)
    text = "\n".join(render(report))
    assert "    MISSING  AuthType = auth/slurm: " in text
    assert "               add: AuthType=auth/munge" in text
    assert "               add: CredType=cred/munge" in text
    fine = nodesets_report([nodeset({"type": "slurm", "keySecret": {"name": "k"}})], [], reads)
    checks = {f["check"]: f["status"] for f in fine["nodesets"][0]["findings"]}
    assert checks["AuthType"] == checks["CredType"] == checks["Slurm version"] == "ok"
    assert "AuthType" not in {f["check"] for f in nodesets_report(
        [nodeset(None)], [], reads)["nodesets"][0]["findings"]}


@given(st.sampled_from(["munge", "slurm"]),
       st.none() | st.dictionaries(
           st.sampled_from(["AuthType", "CredType", "SLURM_VERSION", "AuthInfo"]),
           st.text(max_size=12) | st.sampled_from(
               ["auth/munge", "auth/slurm", "cred/slurm", "23.11.1", "(null)",
                "socket=/run/munge/munge.socket.2"])),
       st.none() | st.sampled_from(["/run/munge", "/run/m"]))
def test_every_finding_not_ok_says_why_and_a_wrong_type_what_to_add(
        kind: str, config: dict[str, str] | None, socket_dir: str | None) -> None:
    for finding in auth_findings(kind, config, munge_socket_dir=socket_dir):
        assert finding.why
        if finding.ok is False and finding.check in ("AuthType", "CredType"):
            assert finding.add and finding.add.endswith(f"/{kind}")
