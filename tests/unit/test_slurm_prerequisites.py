"""The Slurm prerequisites for slurmd pods (`sunkd/slurm/prerequisites.py`): what
`scontrol show config` says, checked; any text parses without an error."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sunkd.slurm.prerequisites import missing, parse_show_config, slurmd_prerequisites

SHOWN = """Configuration data as of 2026-12-03T18:22:32
AccountingStorageHost   = localhost
GresTypes               = (null)
KillWait                = 2 sec
MaxNodeCount            = 2
ReturnToService         = 0
SlurmctldParameters     = (null)
SLURM_VERSION           = 22.05.8
TreeWidth               = 50

Cgroup Support Configuration:
ReturnToService = 2
"""


def test_show_config_parses_and_the_first_value_wins() -> None:
    config = parse_show_config(SHOWN)
    assert config["MaxNodeCount"] == "2" and config["KillWait"] == "2 sec"
    assert config["ReturnToService"] == "0"  # not the later section's
    assert "Configuration" not in config


def test_a_default_controller_misses_what_slurmd_pods_need() -> None:
    findings = slurmd_prerequisites(parse_show_config(SHOWN), nodes_known=2, gpus=True)
    by = {f.check: f for f in findings}
    assert not by["ReturnToService"].ok and by["ReturnToService"].add == "ReturnToService=1"
    assert not by["configless"].ok
    assert by["configless"].add == "SlurmctldParameters=enable_configless"
    assert not by["MaxNodeCount"].ok and by["MaxNodeCount"].add == "MaxNodeCount=4"
    assert not by["TreeWidth"].ok and by["TreeWidth"].only_for == "Dynamic"
    assert by["GresTypes"].add == "GresTypes=gpu"
    static = {f.check for f in missing(findings, "Static")}
    assert static == {"ReturnToService", "configless", "GresTypes"}
    assert {f.check for f in missing(findings, "Dynamic")} == \
        static | {"MaxNodeCount", "TreeWidth"}


def test_a_ready_controller_needs_nothing_and_keeps_its_own_parameters() -> None:
    config = {"ReturnToService": "2", "SlurmctldParameters": "idle_on_node_suspend,"
              "enable_configless", "MaxNodeCount": "16", "SLURM_VERSION": "24.11.5",
              "TreeWidth": "16", "GresTypes": "gpu,shard"}
    findings = slurmd_prerequisites(config, nodes_known=4, nodes_wanted=12, gpus=True)
    assert missing(findings, "Dynamic") == []
    assert "TreeWidth" not in {f.check for f in findings}  # 23.02 and later: no need
    partial = slurmd_prerequisites(config | {"SlurmctldParameters": "idle_on_node_suspend"},
                                   nodes_known=4, nodes_wanted=13)
    by = {f.check: f for f in partial}
    assert by["configless"].add == "SlurmctldParameters=idle_on_node_suspend,enable_configless"
    assert by["MaxNodeCount"].add == "MaxNodeCount=17" and not by["MaxNodeCount"].ok


@given(st.text(), st.integers(0, 10_000), st.integers(0, 10_000), st.booleans())
def test_any_text_gives_findings_never_an_error(text: str, known: int, wanted: int,
                                                 gpus: bool) -> None:
    findings = slurmd_prerequisites(parse_show_config(text), nodes_known=known,
                                    nodes_wanted=wanted, gpus=gpus)
    assert {"ReturnToService", "configless", "MaxNodeCount"} <= {f.check for f in findings}
    for finding in findings:
        assert finding.ok or finding.add, finding  # what is missing says what to add
