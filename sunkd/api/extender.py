"""The kube-scheduler extender: pool pods land only on nodes sunkd gave to Kubernetes.

Taints keep ordinary pool pods off Slurm-owned nodes, but a pod with broad tolerations,
or one scheduled in the instant between "reclaim decided" and "taint observed", could
still land on a node Slurm is about to use. The extender closes that window: the
scheduler asks us (`/scheduler/filter`) and we answer from the folded state.

Wire protocol (k8s.io/kube-scheduler/extender/v1, no json tags: Go field names, which
Go matches case-insensitively, so we do too):
- request `ExtenderArgs`: `Pod` (v1.Pod), `Nodes` (v1.NodeList, when the extender is
  not nodeCacheCapable) or `NodeNames` (when it is);
- filter response `ExtenderFilterResult`: `Nodes` or `NodeNames` (the same form as the
  request: the scheduler ignores `NodeNames` from a non-nodeCacheCapable extender and
  then rejects every node), `FailedNodes`, `FailedAndUnresolvableNodes`, `Error`;
- prioritize response `HostPriorityList`: `[{"Host": name, "Score": 0..10}]`.

Rules: a pod belongs to a pool when its labels match the pool's workload selector (an
empty selector matches no pod). A pool pod passes only on a node of that pool whose
effective phase (`ownership.assess`, so HELD and stale sources count) is KUBERNETES:
owned by Kubernetes and not moving. Failures go to `FailedAndUnresolvableNodes`:
preempting pods never changes who owns a node. Any other pod passes on every node.
Prioritize prefers, for pool pods, nodes least likely to be reclaimed soon: pools with
no pending Slurm demand (+5) and nodes long in KUBERNETES (+1 per hour, up to +5).

The per-node verdicts are computed once per (state, second) and cached, so a filter
over 10,000 nodes costs two dict lookups per node plus JSON (bench/extender.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sunkd.domain.events import Label
from sunkd.domain.ownership import assess
from sunkd.domain.policy import PoolSpec, membership
from sunkd.domain.state import OWNER_KUBERNETES, ClusterState, Phase

MAX_EXTENDER_PRIORITY = 10
CACHE_SECONDS = 1.0


class BadRequest(ValueError):
    """The request is not a valid ExtenderArgs (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ApiPool:
    """A pool as the API sees it: the policy's spec plus the selector of its pods."""

    spec: PoolSpec
    workload_selector: tuple[Label, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    def matches_pod(self, labels: Mapping[str, Any]) -> bool:
        if not self.workload_selector:
            return False
        return all(labels.get(label.key) == label.value for label in self.workload_selector)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the extender says about one Kubernetes node for pods of its pool."""

    pool: str | None
    ok: bool
    why: str
    score: int


@dataclass(slots=True)
class _Index:
    state: ClusterState | None = None
    built_at: float = -1e18
    pools_key: tuple[str, ...] = ()
    verdicts: dict[str, Verdict] = field(default_factory=dict)


def _get(mapping: Mapping[str, Any], name: str) -> Any:
    """Go's encoding/json matches field names case-insensitively."""
    if name in mapping:
        return mapping[name]
    lowered = name.lower()
    for key, value in mapping.items():
        if key.lower() == lowered:
            return value
    return None


def _slurm_demand(state: ClusterState, spec: PoolSpec) -> int:
    total = 0
    for partition in spec.partitions:
        demand = state.slurm_demand.get(partition)
        if demand is not None:
            total += max(demand.pending_nodes, 0) + max(demand.pending_jobs, 0)
    return total


def build_verdicts(state: ClusterState, pools: Sequence[ApiPool], now: float
                   ) -> dict[str, Verdict]:
    """Kubernetes node name -> verdict, for every node in the state."""
    specs = [pool.spec for pool in pools]
    members = membership(state, specs) if specs else {}
    no_demand = {pool.name: _slurm_demand(state, pool.spec) == 0 for pool in pools}
    verdicts: dict[str, Verdict] = {}
    for name, node in state.nodes.items():
        k8s_name = node.k8s_name or name
        pool = members.get(name)
        assessment = assess(state, node, now)
        phase = assessment.phase
        if phase is Phase.KUBERNETES and node.owner == OWNER_KUBERNETES and (
                node.transition is None):
            hours = 0 if node.since is None else int(max(now - node.since, 0.0) // 3600)
            score = min(5, hours) + (5 if no_demand.get(pool or "", False) else 0)
            verdicts[k8s_name] = Verdict(pool, True, "", min(score, MAX_EXTENDER_PRIORITY))
            continue
        if phase is Phase.UNKNOWN:
            why = "sunkd: ownership unknown (" + "; ".join(assessment.unknown_reasons) + ")"
        elif phase is Phase.HELD:
            why = "sunkd: node held (" + "; ".join(assessment.hold_reasons) + ")"
        elif phase in (Phase.TO_K8S, Phase.TO_SLURM):
            why = f"sunkd: node is moving ({phase.value})"
        else:
            why = f"sunkd: not owned by Kubernetes (owner={node.owner}, phase={phase.value})"
        verdicts[k8s_name] = Verdict(pool, False, why, 0)
    return verdicts


class Extender:
    """Filter and prioritize over the live state. `state` and `pools` are read per call."""

    def __init__(self, state: Callable[[], ClusterState], pools: Callable[[], Sequence[ApiPool]],
                 clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._pools = pools
        self._clock = clock
        self._index = _Index()

    def verdicts(self) -> tuple[dict[str, Verdict], Sequence[ApiPool]]:
        state = self._state()
        pools = self._pools()
        now = self._clock()
        key = tuple(f"{pool.name}:{id(pool)}" for pool in pools)
        index = self._index
        if index.state is not state or index.pools_key != key or (
                now - index.built_at >= CACHE_SECONDS or now < index.built_at):
            index = _Index(state, now, key, build_verdicts(state, pools, now))
            self._index = index
        return index.verdicts, pools

    # ----------------------------------------------------------------- parsing

    @staticmethod
    def parse(body: bytes) -> tuple[Mapping[str, Any], list[str], list[Any] | None]:
        """(pod, node names, NodeList items or None when NodeNames were sent)."""
        try:
            args = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BadRequest(f"body is not JSON: {error}") from error
        if not isinstance(args, dict):
            raise BadRequest("ExtenderArgs must be a JSON object")
        pod = _get(args, "Pod")
        if not isinstance(pod, dict):
            raise BadRequest("ExtenderArgs.Pod must be a v1.Pod object")
        names = _get(args, "NodeNames")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
            return pod, names, None
        nodes = _get(args, "Nodes")
        if not isinstance(nodes, dict):
            raise BadRequest("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes "
                             "(a v1.NodeList)")
        items = nodes.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list")
        found: list[str] = []
        for index, item in enumerate(items):
            metadata = item.get("metadata") if isinstance(item, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{index}].metadata.name missing")
            found.append(name)
        return pod, found, items

    @staticmethod
    def pod_labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
        metadata = pod.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise BadRequest("Pod.metadata must be an object")
        labels = (metadata or {}).get("labels")
        if labels is None:
            return {}
        if not isinstance(labels, dict):
            raise BadRequest("Pod.metadata.labels must be an object")
        return labels

    # ------------------------------------------------------------------- verbs

    def filter(self, body: bytes) -> dict[str, Any]:
        """ExtenderArgs bytes -> ExtenderFilterResult (raises BadRequest)."""
        pod, names, items = self.parse(body)
        labels = self.pod_labels(pod)
        verdicts, pools = self.verdicts()
        pool = next((p for p in pools if p.matches_pod(labels)), None)
        failed: dict[str, str] = {}
        if pool is None:
            passing = names
        else:
            passing = []
            pool_name = pool.name
            for name in names:
                verdict = verdicts.get(name)
                if verdict is None:
                    failed[name] = f"sunkd: not a node of pool {pool_name}"
                elif verdict.pool != pool_name:
                    failed[name] = f"sunkd: not a node of pool {pool_name}"
                elif not verdict.ok:
                    failed[name] = verdict.why
                else:
                    passing.append(name)
        result: dict[str, Any] = {
            "Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": failed, "Error": "",
        }
        if items is None:
            result["NodeNames"] = passing
        else:
            keep = set(passing)
            result["Nodes"] = {
                "apiVersion": "v1", "kind": "NodeList", "metadata": {},
                "items": [item for item in items if item["metadata"]["name"] in keep],
            }
        return result

    def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        """ExtenderArgs bytes -> HostPriorityList (raises BadRequest)."""
        pod, names, _items = self.parse(body)
        labels = self.pod_labels(pod)
        verdicts, pools = self.verdicts()
        pool = next((p for p in pools if p.matches_pod(labels)), None)
        if pool is None:
            return [{"Host": name, "Score": 0} for name in names]
        scores: list[dict[str, Any]] = []
        for name in names:
            verdict = verdicts.get(name)
            score = verdict.score if verdict is not None and verdict.ok and (
                verdict.pool == pool.name) else 0
            scores.append({"Host": name, "Score": score})
        return scores
