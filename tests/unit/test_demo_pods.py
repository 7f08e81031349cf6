"""`sunkd demo --slurmd-pods` without the real bed: it refuses to start without root (and
says why), and its lend/reclaim figures are the first samples that show each step."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sunkd.domain.events import RecordedEvent, TransitionCompleted, TransitionStarted
from sunkd.runtime.config import Settings
from sunkd_testbed import demopods
from sunkd_testbed.demopods import NodeSample, Sampler, moves
from sunkd_testbed.slurmdpods import SlurmView


async def test_without_root_it_says_so_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(demopods.os, "geteuid", lambda: 1000)
    database = tmp_path / "sunkd.db"
    code = await demopods.run_pods_demo(
        Settings(database_url=f"sqlite+aiosqlite:///{database}"), duration=1, node_count=3,
        summary_json=None, listen=None)
    assert code == 2
    assert "needs root" in capsys.readouterr().err
    assert not database.exists()


def _event(seq: int, at: float, payload: object) -> RecordedEvent:
    return RecordedEvent(seq, datetime.fromtimestamp(at, UTC), 1, "n1", payload)  # type: ignore[arg-type]


def test_moves_time_each_step_from_the_decision() -> None:
    sampler = Sampler(None, None, {"n1": "k1"})
    idle, gone = SlurmView("IDLE", 100.0), SlurmView("IDLE+DRAIN", 100.0)
    down = SlurmView("DOWN+DRAIN+NOT_RESPONDING", 100.0)
    back = SlurmView("DOWN+DRAIN", 1030.0)
    for at, sample in [
        (1000.0, NodeSample("Running", True, idle)),
        (1001.0, NodeSample("Terminating", True, gone)),
        (1002.0, NodeSample(None, True, gone)),  # the pod goes first ...
        (1002.5, NodeSample(None, False, gone)),  # ... then the taint
        (1029.0, NodeSample(None, True, down)),
        (1030.0, NodeSample("Pending", True, down)),
        (1031.0, NodeSample("Running", True, down)),  # Running, not heard yet
        (1031.5, NodeSample("Running", True, back)),  # registered
        (1033.0, NodeSample("Running", True, SlurmView("IDLE", 1030.0))),  # undrained
    ]:
        sampler.samples.append((at, {"n1": sample}))
    events = [
        _event(1, 1000.0, TransitionStarted("t1", "n1", "p", "slurm", "kubernetes")),
        _event(2, 1003.0, TransitionCompleted("t1", "n1", "p", "slurm", "kubernetes")),
        _event(3, 1028.0, TransitionStarted("t2", "n1", "p", "kubernetes", "slurm")),
        _event(4, 1034.0, TransitionCompleted("t2", "n1", "p", "kubernetes", "slurm")),
        # the adoption of a node at start is neither a lend nor a reclaim
        _event(5, 1035.0, TransitionStarted("t3", "n1", "p", "", "slurm")),
        _event(6, 1036.0, TransitionCompleted("t3", "n1", "p", "", "slurm")),
    ]
    assert moves(events, sampler) == {
        "lends": [{"node": "n1", "completed_s": 3.0, "pod_gone_s": 2.0, "untainted_s": 2.5}],
        "reclaims": [{"node": "n1", "completed_s": 6.0, "pod_registered_s": 3.5,
                      "undrained_s": 5.0}],
    }
