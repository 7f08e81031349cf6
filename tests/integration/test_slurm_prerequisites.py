"""The slurmd-pod prerequisites against real slurmctld, on each Slurm generation: a
controller as the harness configures it misses what the checks say it misses, and the
very lines the checks suggest, added to slurm.conf, are accepted by slurmctld and make
every check pass (the advice `sunkd doctor` prints is advice Slurm takes)."""

from __future__ import annotations

import pytest

from sunkd.slurm.auth_checks import auth_findings
from sunkd.slurm.prerequisites import missing, parse_show_config, slurmd_prerequisites
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import slurm_test_versions, start_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

NODES = "pq[1-2]"


def _config(cluster: SlurmCluster) -> dict[str, str]:
    return parse_show_config(cluster.scontrol("show", "config"))


@pytest.mark.parametrize("version", [pytest.param(v, id=f"slurm-{v}")
                                     for v in slurm_test_versions()])
def test_the_suggested_lines_are_what_slurmctld_needs(version: str) -> None:
    for cluster in start_cluster(NODES, version=version, return_to_service=0):
        before = slurmd_prerequisites(_config(cluster), nodes_known=2, nodes_wanted=6,
                                      gpus=True)
    by = {f.check: f for f in before}
    assert not by["ReturnToService"].ok and by["ReturnToService"].found == "0"
    assert not by["configless"].ok and not by["GresTypes"].ok
    assert not by["MaxNodeCount"].ok and by["MaxNodeCount"].add == "MaxNodeCount=8"
    assert ("TreeWidth" in by) == (version == "22.05")
    lines = [f.add for f in missing(before, "Dynamic") if f.add is not None]
    # The harness writes its own ReturnToService line: take the suggestion through it.
    lines.remove("ReturnToService=1")
    for cluster in start_cluster(NODES, version=version, return_to_service=1,
                                 extra_conf=lines):
        after = slurmd_prerequisites(_config(cluster), nodes_known=2, nodes_wanted=6,
                                     gpus=True)
    assert missing(after, "Dynamic") == [], after


@pytest.mark.parametrize("version", [pytest.param(v, id=f"slurm-{v}")
                                     for v in slurm_test_versions()])
def test_the_auth_checks_read_slurmctld_as_it_runs(version: str) -> None:
    """`sunkd doctor`'s auth checks against `scontrol show config` of a munge cluster and
    (23.11+) of one running the lines they suggest for auth/slurm."""
    for cluster in start_cluster(NODES, version=version):
        munge = _config(cluster)
    by = {f.check: f for f in auth_findings("munge", munge, munge_socket_dir="/run/munge")}
    assert by["AuthType"].ok and by["CredType"].ok
    # The harness's munged listens in its own directory, not where a sidecar would.
    assert by["AuthInfo socket"].ok is False
    assert by["AuthInfo socket"].add == "AuthInfo=socket=/run/munge/munge.socket.2"
    wanted = {f.check: f for f in auth_findings("slurm", munge)}
    assert [wanted[c].add for c in ("AuthType", "CredType")] == [
        "AuthType=auth/slurm", "CredType=cred/slurm"]
    assert wanted["Slurm version"].ok is (version != "22.05")
    if version == "22.05":
        return  # no auth/slurm before 23.11
    for cluster in start_cluster(NODES, version=version, auth="slurm"):
        running = _config(cluster)
    assert all(f.ok for f in auth_findings("slurm", running)), auth_findings("slurm", running)
    assert {f.check for f in auth_findings("munge", running) if not f.ok} == {
        "AuthType", "CredType"}
