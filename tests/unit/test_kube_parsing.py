"""Pure helpers of the Kubernetes client and source: quantities, times, Nodeset spec, pod math."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from sunkd.domain.events import Label, OwnershipSpec
from sunkd.kubernetes.client import NODES, PODS, nodesets
from sunkd.kubernetes.normalize import (
    parse_duration,
    parse_nodeset,
    pod_is_pending_unschedulable,
    pod_requests,
)
from sunkd.kubernetes.wire import format_micro_time, format_time, parse_quantity, parse_time


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("1Gi", Decimal(2**30)),
        ("512Mi", Decimal(512 * 2**20)),
        ("1e9", Decimal(10**9)),
        ("1G", Decimal(10**9)),
        ("100k", Decimal(100_000)),
        (4, Decimal(4)),
    ],
)
def test_parse_quantity(text: object, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Xi", True, None])
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_micro_time_always_has_six_digits() -> None:
    # isoformat() drops the fraction at microsecond 0: the API server rejects that (#89156).
    moment = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert format_micro_time(moment) == "2024-01-01T12:00:00.000000Z"
    offset = datetime(2024, 1, 1, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    assert format_micro_time(offset) == "2024-01-01T12:00:00.000005Z"
    assert format_time(offset) == "2024-01-01T12:00:00Z"
    assert parse_time("2024-01-01T12:00:00.000005Z") == datetime(2024, 1, 1, 12, 0, 0, 5, UTC)
    with pytest.raises(ValueError):
        format_time(datetime(2024, 1, 1))  # naive: refuse to guess the zone


def test_paths() -> None:
    assert NODES.object_path("n1", subresource="status") == "/api/v1/nodes/n1/status"
    assert PODS.collection_path() == "/api/v1/pods"
    assert PODS.object_path("p", "ns", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    rt = nodesets("sunk.example.io", "v1")
    assert rt.object_path("a", "b", "status") == (
        "/apis/sunk.example.io/v1/namespaces/b/nodesets/a/status"
    )
    with pytest.raises(ValueError):
        PODS.object_path("p")


def test_durations() -> None:
    assert parse_duration("90s", 0) == 90
    assert parse_duration("1h30m", 0) == 5400
    assert parse_duration("250ms", 0) == 0.25
    assert parse_duration(12, 0) == 12
    assert parse_duration(None, 7) == 7
    with pytest.raises(ValueError):
        parse_duration("5x", 0)


def test_parse_nodeset() -> None:
    obj = {
        "metadata": {"namespace": "ml", "name": "gpu", "generation": 3},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "workloadSelector": {"matchLabels": {"app": "serve"}},
            "slurm": {"partitions": ["gpu"], "nodeNameLabel": "slurm/name"},
            "ownership": {"mode": "Auto", "minSlurm": 2, "maxKubernetes": 4, "dwell": "2m"},
        },
    }
    parsed = parse_nodeset(obj)
    assert parsed.pool == "ml/gpu"
    assert parsed.generation == 3
    assert parsed.node_selector == (Label("pool", "gpu"),)
    assert parsed.workload_selector == (Label("app", "serve"),)
    assert parsed.partitions == ("gpu",)
    assert parsed.node_name_label == "slurm/name"
    assert parsed.ownership == OwnershipSpec(min_slurm=2, max_kubernetes=4, dwell_seconds=120.0)
    assert parse_nodeset(obj, deleted=True).deleted


def test_pod_requests_follow_scheduler_rule() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "250m", "nvidia.com/gpu": "1"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"memory": "10Mi"},
        }
    }
    assert pod_requests(pod) == (2000, 2**30 + 10 * 2**20, 1)


def test_pending_unschedulable() -> None:
    unscheduled = {"spec": {}, "status": {"phase": "Pending"}}
    assert pod_is_pending_unschedulable(unscheduled)
    bound = {"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}
    assert not pod_is_pending_unschedulable(bound)
    rejected = {
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    assert pod_is_pending_unschedulable(rejected)
    running = {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert not pod_is_pending_unschedulable(running)
