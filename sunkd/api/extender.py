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

Per-node verdicts are cached and recomputed only for nodes the fold changed, so a
filter over 10,000 nodes costs a set lookup per node plus JSON (bench/extender.py).

Bounds: the extender is reachable without authentication, so the work per
request is bounded by the number of nodes (`MAX_NODES`, beyond it `TooLarge`: HTTP 413),
not only by bytes, and JSON nested too deeply is a `BadRequest` (400). The HTTP layer runs
`filter_bytes`/`prioritize_bytes` in one worker thread, off the event loop (sunkd/api/app.py),
so they must not touch anything but the state and pools they read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label
from sunkd.domain.ownership import UNHEALTHY_GRACE_SECONDS, assess, slurm_drained
from sunkd.domain.policy import PoolSpec, membership
from sunkd.domain.state import ClusterState, NodeState, Phase

MAX_EXTENDER_PRIORITY = 10
# Most nodes one ExtenderArgs may name. Kubernetes supports clusters of 5,000 nodes (the
# largest run about 15,000); a filter over 20,000 costs ~3.5 ms with warm verdicts and
# ~0.2 s right after a fold changed every node (bench/extender.py --nodes 20000).
MAX_NODES = 20_000


class BadRequest(ValueError):
    """The request is not a valid ExtenderArgs (HTTP 400)."""


class TooLarge(BadRequest):
    """The request names more nodes than `MAX_NODES` (HTTP 413)."""


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
    """What the extender says about one Kubernetes node for pods of its pool. `why` is
    one of a few fixed texts so kube-scheduler's "0/N nodes are available: ..." summary
    groups them; `/api/v1/nodes/{name}` has the details."""

    pool: str | None
    ok: bool
    why: str
    k8s_since: float | None = None  # when it became Kubernetes-owned (ok nodes)


WHY_SLURM = "sunkd: owned by Slurm"
WHY_MOVING = "sunkd: moving between Slurm and Kubernetes"
WHY_HELD = "sunkd: held (foreign drain or cordon, NotReady, DOWN)"
WHY_UNKNOWN = "sunkd: ownership unknown (stale source or not observed on both sides)"


@dataclass(slots=True)
class _Entry:
    node: NodeState
    k8s_name: str
    encoded: str  # json.dumps(k8s_name), reused when answering
    verdict: Verdict
    valid_until: float  # the verdict depends on time (unhealthy grace) until then


@dataclass(slots=True)
class _Index:
    state: ClusterState | None = None
    pools: tuple[ApiPool, ...] = ()
    sources: Mapping[str, Any] | None = None
    entries: dict[str, _Entry] = field(default_factory=dict)  # by Slurm node name
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by Kubernetes node name
    encoded: dict[str, str] = field(default_factory=dict)  # k8s name -> its JSON string
    passing: dict[str, frozenset[str]] = field(default_factory=dict)  # pool -> k8s names
    no_demand: dict[str, bool] = field(default_factory=dict)  # pool -> no Slurm demand
    next_expiry: float = float("inf")
    # pool -> k8s name -> its pre-encoded `"name":"why"` entry of the failed-nodes map,
    # built on the first filter for that pool after each state change.
    failed_parts: dict[str, dict[str, str]] = field(default_factory=dict)

    def failed_parts_for(self, pool_name: str) -> dict[str, str]:
        parts = self.failed_parts.get(pool_name)
        if parts is None:
            not_member = json.dumps(f"sunkd: not a node of pool {pool_name}")
            reasons: dict[str, str] = {}
            ok = self.passing.get(pool_name, frozenset())
            parts = {}
            for name, verdict in self.verdicts.items():
                if name in ok:
                    continue
                if verdict.pool != pool_name:
                    why_json = not_member
                else:
                    why_json = reasons.get(verdict.why) or reasons.setdefault(
                        verdict.why, json.dumps(verdict.why))
                parts[name] = self.encoded[name] + ":" + why_json
            self.failed_parts[pool_name] = parts
        return parts


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


def _verdict(state: ClusterState, node: NodeState, pool: str | None, now: float
             ) -> tuple[Verdict, float]:
    assessment = assess(state, node, now)
    phase = assessment.phase
    valid_until = float("inf")
    if node.slurm_unhealthy_since is not None:
        # Becomes HELD once the unhealthy grace has passed: re-judge then.
        valid_until = node.slurm_unhealthy_since + UNHEALTHY_GRACE_SECONDS
        if valid_until <= now:
            valid_until = float("inf")
    if phase is Phase.KUBERNETES and node.owner == wk.OWNER_KUBERNETES and node.transition is None:
        return Verdict(pool, True, "", node.since), valid_until
    if phase is Phase.TO_K8S and _handing_over(node):
        # The lend's last step is under way: Slurm reported the node drained and the owner
        # taint is coming off. kube-scheduler retries the waiting pod the moment the taint
        # goes; refusing it here would leave it for the scheduler's 5-minute retry of
        # unschedulable pods (seen on the real scheduler). Passing it is safe: until the
        # taint is really gone the taint itself keeps pool pods off.
        return Verdict(pool, True, "", node.since), valid_until
    if phase is Phase.UNKNOWN:
        why = WHY_UNKNOWN
    elif phase is Phase.HELD:
        why = WHY_HELD
    elif phase in (Phase.TO_K8S, Phase.TO_SLURM) or node.transition is not None:
        why = WHY_MOVING
    else:
        why = WHY_SLURM
    return Verdict(pool, False, why), valid_until


def _handing_over(node: NodeState) -> bool:
    transition = node.transition
    if transition is None or transition.direction not in ("lend", "adopt"):
        return False
    if not slurm_drained(node.slurm):
        return False
    return transition.did("kubernetes", "unlock") or any(
        action.verb == "unlock" and action.transition_id == transition.transition_id
        for action in node.open_actions.values())


class Extender:
    """Filter and prioritize over the live state. `state` and `pools` are read per call.

    Verdicts are cached per node and recomputed only for nodes whose `NodeState` object
    changed (the fold is copy-on-write, so unchanged nodes keep their identity), all of
    them when sources or pools change, and a node's at the end of its unhealthy grace.
    """

    def __init__(self, state: Callable[[], ClusterState], pools: Callable[[], Sequence[ApiPool]],
                 clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._pools = pools
        self._clock = clock
        self._index = _Index()

    def _refresh(self) -> tuple[_Index, float]:
        state = self._state()
        now = self._clock()
        index = self._index
        if index.state is state and now < index.next_expiry:
            return index, now
        pools = tuple(self._pools())
        full = index.sources is not state.sources or index.pools != pools
        old = {} if full else index.entries
        changed = {name: node for name, node in state.nodes.items()
                   if (entry := old.get(name)) is None or entry.node is not node
                   or entry.valid_until <= now}
        specs = [pool.spec for pool in pools]
        members = membership(replace(state, nodes=changed), specs) if specs and changed else {}
        entries: dict[str, _Entry] = {}
        verdicts: dict[str, Verdict] = {}
        encoded: dict[str, str] = {}
        passing: dict[str, set[str]] = {pool.name: set() for pool in pools}
        next_expiry = float("inf")
        for name, node in state.nodes.items():
            if name in changed:
                verdict, valid_until = _verdict(state, node, members.get(name), now)
                k8s_name = node.k8s_name or name
                entry = _Entry(node, k8s_name, json.dumps(k8s_name), verdict, valid_until)
            else:
                entry = old[name]
            entries[name] = entry
            verdicts[entry.k8s_name] = entry.verdict
            encoded[entry.k8s_name] = entry.encoded
            next_expiry = min(next_expiry, entry.valid_until)
            if entry.verdict.ok and entry.verdict.pool in passing:
                passing[entry.verdict.pool].add(entry.k8s_name)
        index = _Index(
            state=state, pools=pools, sources=state.sources, entries=entries,
            verdicts=verdicts, encoded=encoded,
            passing={pool: frozenset(names) for pool, names in passing.items()},
            no_demand={pool.name: _slurm_demand(state, pool.spec) == 0 for pool in pools},
            next_expiry=next_expiry)
        self._index = index
        return index, now

    def verdicts(self) -> tuple[dict[str, Verdict], Sequence[ApiPool]]:
        index, _now = self._refresh()
        return index.verdicts, index.pools

    # ----------------------------------------------------------------- parsing

    max_nodes = MAX_NODES

    def parse(self, body: bytes) -> tuple[Mapping[str, Any], list[str], list[Any] | None]:
        """(pod, node names, NodeList items or None when NodeNames were sent)."""
        try:
            args = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BadRequest(f"body is not JSON: {error}") from error
        except RecursionError:
            raise BadRequest("body is JSON nested too deeply") from None
        except ValueError as error:  # an integer over `sys.get_int_max_str_digits()` digits
            raise BadRequest(f"body is not JSON sunkd reads: {error}") from None
        if not isinstance(args, dict):
            raise BadRequest("ExtenderArgs must be a JSON object")
        pod = _get(args, "Pod")
        if not isinstance(pod, dict):
            raise BadRequest("ExtenderArgs.Pod must be a v1.Pod object")
        names = _get(args, "NodeNames")
        if names is not None:
            if not isinstance(names, list) or not all(map(isinstance, names, repeat(str))):
                raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
            self._check_count(len(names))
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
        self._check_count(len(items))
        found: list[str] = []
        for index, item in enumerate(items):
            metadata = item.get("metadata") if isinstance(item, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{index}].metadata.name missing")
            found.append(name)
        return pod, found, items

    def _check_count(self, count: int) -> None:
        if count > self.max_nodes:
            raise TooLarge(f"ExtenderArgs names {count} nodes; sunkd answers for at most "
                           f"{self.max_nodes} per request")

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
        """ExtenderArgs bytes -> ExtenderFilterResult as a dict (raises BadRequest)."""
        result: dict[str, Any] = json.loads(self.filter_bytes(body))
        return result

    def filter_bytes(self, body: bytes) -> bytes:
        """ExtenderArgs bytes -> ExtenderFilterResult JSON bytes (raises BadRequest).

        The failed-nodes map is assembled from pre-encoded node names and a handful of
        reason texts: for a pool pod over 10,000 nodes it is most of the answer, and
        json.dumps of such a dict would cost more than everything else together."""
        pod, names, items = self.parse(body)
        labels = self.pod_labels(pod)
        index, _now = self._refresh()
        pool = next((p for p in index.pools if p.matches_pod(labels)), None)
        failed_json = "{}"
        if pool is None:
            passing = names
        else:
            ok = index.passing.get(pool.name, frozenset())
            passing = [name for name in names if name in ok]
            if len(passing) != len(names):
                known = index.failed_parts_for(pool.name)
                not_member = json.dumps(f"sunkd: not a node of pool {pool.name}")
                # dict.fromkeys: a name listed twice appears once in the map.
                failing = dict.fromkeys(name for name in names if name not in ok)
                failed_json = "{" + ",".join(
                    known.get(name) or (json.dumps(name) + ":" + not_member)
                    for name in failing) + "}"
        if items is None:
            nodes_json, names_json = "null", json.dumps(passing, separators=(",", ":"))
        else:
            keep = set(passing)
            nodes_json = json.dumps({
                "apiVersion": "v1", "kind": "NodeList", "metadata": {},
                "items": [item for item in items if item["metadata"]["name"] in keep],
            }, separators=(",", ":"))
            names_json = "null"
        return (f'{{"Nodes":{nodes_json},"NodeNames":{names_json},"FailedNodes":{{}},'
                f'"FailedAndUnresolvableNodes":{failed_json},"Error":""}}').encode()

    def prioritize_bytes(self, body: bytes) -> bytes:
        """ExtenderArgs bytes -> HostPriorityList JSON bytes (raises BadRequest)."""
        return json.dumps(self.prioritize(body), separators=(",", ":")).encode()

    def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        """ExtenderArgs bytes -> HostPriorityList (raises BadRequest)."""
        pod, names, _items = self.parse(body)
        labels = self.pod_labels(pod)
        index, now = self._refresh()
        pool = next((p for p in index.pools if p.matches_pod(labels)), None)
        if pool is None:
            return [{"Host": name, "Score": 0} for name in names]
        ok = index.passing.get(pool.name, frozenset())
        bonus = 5 if index.no_demand.get(pool.name, False) else 0
        scores: list[dict[str, Any]] = []
        for name in names:
            score = 0
            if name in ok:
                since = index.verdicts[name].k8s_since
                hours = 0 if since is None else int(max(now - since, 0.0) // 3600)
                score = min(MAX_EXTENDER_PRIORITY, min(5, hours) + bonus)
            scores.append({"Host": name, "Score": score})
        return scores
