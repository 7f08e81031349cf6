"""The planner: the state of one `decide` round, and the helpers every step shares.

`Planner` accumulates the round's decisions and hands out their ids (`tx-<seq>-<n>`,
`act-<seq>-<n>`: unique per log position, identical on replay). `ensure` is the one
place that turns "this action is wanted" into a `RequestAction`, honouring open
actions, pending observations and retry backoff. The step modules (lend, reclaim,
holds, repair, transitions, pool) all build on this module and on `model`.
"""

from __future__ import annotations

from sunkd.domain import wellknown as wk
from sunkd.domain.events import Label, SlurmNodeObserved
from sunkd.domain.ownership import has_owner_taint, no_pods, running_pod_count, running_pods
from sunkd.domain.policy.model import (
    OBSERVATION_CATCHUP_SECONDS,
    REFUSED_RETRY_SECONDS,
    AbortTransition,
    CompleteTransition,
    Decision,
    RequestAction,
    StartTransition,
    retry_backoff,
)
from sunkd.domain.slurmnode import slurm_unhealthy
from sunkd.domain.state import ClusterState, NodeState, OpenTransition

_REQUESTED = "requested"
_WAITING = "waiting"
OUTCOME_FAILED = "failed"  # a non-retryable failure of this verb within this transition


def active_pods(node: NodeState) -> list[str]:
    return running_pods(node)


def active_pod_count(node: NodeState) -> int:
    return running_pod_count(node)


def expected_drain(slurm: SlurmNodeObserved) -> tuple[Label, ...]:
    """The drain a resume expects to remove: the actuator refuses if Slurm's reason (or
    the time it was set) changed since this decision (an admin re-drained the node)."""
    labels = [Label("expect_reason", slurm.reason or "")]
    if slurm.reason_time is not None:
        labels.append(Label("expect_reason_time", f"{slurm.reason_time:.0f}"))
    return tuple(labels)


def evict_args(node: NodeState) -> tuple[Label, ...]:
    """`pod` = namespace/name for every pod to evict, and `pod_uid` = namespace/name=uid
    where the source saw its uid: the actuator evicts exactly that pod (a StatefulSet pod
    re-created under the same name elsewhere is not it)."""
    pods = running_pods(node)
    uids = {f"{p.namespace}/{p.name}": p.uid for p in node.pods or ()}
    labels = [Label("pod", pod) for pod in pods]
    labels += [Label("pod_uid", f"{pod}={uids[pod]}") for pod in pods if uids.get(pod)]
    return tuple(labels)


def may_resume(node: NodeState) -> bool:
    """Slurm may get the node back only while pool pods are kept off and gone, and only
    while Slurm reports it healthy (a DOWN/FAIL/NOT_RESPONDING node is Slurm's to handle:
    sunkd's drain stays until it is well again)."""
    slurm = node.slurm
    return (has_owner_taint(node.k8s) and no_pods(node)
            and not (slurm is not None and slurm_unhealthy(slurm)))


class Planner:
    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.now = now
        self.decisions: list[Decision] = []
        self.prefix = state.last_seq
        self.transition_count = 0
        self.action_count = 0
        self.touched: set[str] = set()  # nodes that got a decision in this round
        self.ended: set[str] = set()  # transition ids completed or aborted this round
        self.aborted: set[str] = set()  # the aborted ones among them
        self.busy_sides: set[tuple[str, str]] = set()
        self.repairing: set[str] = set()  # nodes whose slurmd pod is being repaired: no lend

    # ids: unique per log position, identical on replay
    def _transition_id(self) -> str:
        self.transition_count += 1
        return f"tx-{self.prefix}-{self.transition_count}"

    def _action_id(self) -> str:
        self.action_count += 1
        return f"act-{self.prefix}-{self.action_count}"

    def ensure(
        self,
        node: NodeState,
        side: str,
        verb: str,
        reason: str,
        args: tuple[Label, ...] = (),
        transition_id: str | None = None,
        min_attempt: int = 1,
        await_observation: bool = True,
        caught_up: bool = False,
    ) -> str:
        """Request `verb` unless it is open, just succeeded (awaiting its observation)
        or in backoff. The caller has already checked the world is not as wanted.
        `min_attempt`: the attempt number the caller counts (a slurmd pod's repair counts
        its recreates, `policy/slurmdrepair.py`); the log keeps it with the outcome.
        `await_observation=False`: the caller's observation is not the side's node
        observation (a pod's label is in the pods report, which moves no `k8s_seq`), and
        the verb is idempotent and may flip back at once (a slurmd pod's busy label:
        a job starting seconds after the label came off must not wait for the catch-up),
        so a just-succeeded one does not hold it back; a failure's backoff still does.
        `caught_up`: the caller knows the last success's effect was observed in a way
        the node's observation sequence does not show (a pod it created seen and since
        deleted), so no wait for it."""
        if (node.name, side) in self.busy_sides or node.open_action_on(side) is not None:
            return _WAITING
        attempt = 1
        outcome = node.outcomes.get(f"{side}/{verb}")
        if outcome is not None:
            if outcome.succeeded and not caught_up:
                observed_seq = node.slurm_seq if side == wk.OWNER_SLURM else node.k8s_seq
                if (
                    await_observation
                    and observed_seq < outcome.seq
                    and self.now - outcome.at < OBSERVATION_CATCHUP_SECONDS
                ):
                    return _WAITING
            elif outcome.succeeded:
                pass
            elif transition_id is not None and outcome.transition_id != transition_id:
                pass  # a failure of an earlier transition does not hold back a new one
            elif outcome.retryable:
                attempt = outcome.attempt + 1
                if self.now < outcome.at + retry_backoff(outcome.attempt):
                    return _WAITING
            else:
                if transition_id is not None:
                    return OUTCOME_FAILED
                attempt = outcome.attempt + 1
                if self.now < outcome.at + REFUSED_RETRY_SECONDS:
                    return _WAITING
        attempt = max(attempt, min_attempt)
        if side == wk.OWNER_KUBERNETES:
            args = (Label("k8s_node", node.k8s_name or node.name), *args)
        self.decisions.append(
            RequestAction(
                action_id=self._action_id(),
                transition_id=transition_id,
                side=side,
                verb=verb,
                node=node.name,
                attempt=attempt,
                reason=reason,
                args=args,
            )
        )
        self.busy_sides.add((node.name, side))
        self.touched.add(node.name)
        return _REQUESTED

    def start(
        self, node: NodeState, pool: str, from_owner: str, to_owner: str, reason: str
    ) -> OpenTransition:
        transition_id = self._transition_id()
        self.decisions.append(
            StartTransition(transition_id, node.name, pool, from_owner, to_owner, reason)
        )
        self.touched.add(node.name)
        return OpenTransition(
            transition_id=transition_id,
            pool=pool,
            from_owner=from_owner,
            to_owner=to_owner,
            started_at=self.now,
            reason=reason,
        )

    def complete(self, node: NodeState, transition: OpenTransition, reason: str) -> None:
        self.ended.add(transition.transition_id)
        self.decisions.append(
            CompleteTransition(
                transition.transition_id,
                node.name,
                transition.pool,
                transition.from_owner,
                transition.to_owner,
                reason,
            )
        )
        self.touched.add(node.name)

    def abort(self, node: NodeState, transition: OpenTransition, reason: str) -> None:
        self.ended.add(transition.transition_id)
        self.aborted.add(transition.transition_id)
        self.decisions.append(
            AbortTransition(
                transition.transition_id,
                node.name,
                transition.pool,
                transition.from_owner,
                transition.to_owner,
                reason,
            )
        )
        self.touched.add(node.name)
