"""Turns a requested action from the outbox into a call on the right actuator.

The policy names nodes by their Slurm name; Kubernetes actions are addressed to the
Kubernetes node name, which the fold knows (label `sunkd.io/slurm-node-name` can make
them differ). Arguments travel as (key, value) pairs on the `action.requested` event.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.policy import (
    RETURN_TO_SERVICE_ARG,
    SLURMD_GONE_ARG,
    SLURMD_REPAIR_ARG,
    VERB_DRAIN,
    VERB_EVICT,
    VERB_HOLD,
    VERB_LOCK,
    VERB_RELEASE,
    VERB_RESUME,
    VERB_UNLOCK,
    VERB_WARN,
)
from sunkd.domain.policy.defunct import FEATURE_ARG
from sunkd.domain.policy.slurmd import VERB_SLURMD_CREATE, VERB_SLURMD_DELETE
from sunkd.domain.policy.slurmdbusy import BUSY_ARG, VERB_SLURMD_LABEL
from sunkd.domain.policy.slurmdfinalizer import VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE
from sunkd.domain.ports import ActionError
from sunkd.domain.slurmddefunct import slurm_problem
from sunkd.domain.slurmdgone import VERB_DELETE_NODE
from sunkd.domain.slurmnode import in_contact
from sunkd.domain.state import NodeState, OpenAction
from sunkd.slurm.model import SlurmJob, SlurmNode

# Annotations mirroring a Slurm-side hold onto the Kubernetes node.


log = structlog.get_logger(__name__)


class SlurmActions(Protocol):
    async def drain(self, node: str, reason: str) -> bool: ...
    async def resume(self, node: str, *, expect_reason: str | None = None,
                     expect_reason_time: float | None = None,
                     return_to_service: bool = False) -> bool: ...
    async def delete_node(self, node: str, *, feature: str) -> bool: ...


class SlurmReader(Protocol):
    async def get_nodes(self) -> list[SlurmNode]: ...


# A job in one of these states holds nothing on a node any more (squeue(1) "JOB STATE
# CODES"); any other state (PENDING, RUNNING, SUSPENDED, COMPLETING, CONFIGURING,
# REQUEUED, ...) may run on or wait for its nodes.
ENDED_JOB_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
})


class KubernetesActions(Protocol):
    async def lock(self, node: str) -> bool: ...
    async def unlock(self, node: str) -> bool: ...
    async def hold(self, node: str, reason: str) -> bool: ...
    async def release(self, node: str) -> bool: ...
    async def annotate(self, node: str, values: dict[str, str | None]) -> bool: ...
    async def evict(self, namespace: str, pod: str, *, uid: str | None = None,
                    node: str | None = None) -> bool: ...
    async def post_event(self, node: str, reason: str, message: str,
                         type: str = "Warning") -> bool: ...
    async def slurmd(self, verb: str, slurm_node: str, k8s_node: str,
                     args: dict[str, str]) -> bool: ...


def _args(action: OpenAction, key: str) -> list[str]:
    return [label.value for label in action.args if label.key == key]


def _arg(action: OpenAction, key: str) -> str | None:
    values = _args(action, key)
    return values[0] if values else None


class ActuatorExecutor:
    """An `ActionExecutor` over the Slurm and Kubernetes actuators."""

    def __init__(self, slurm: SlurmActions | None, kubernetes: KubernetesActions | None,
                 slurm_reader: SlurmReader | None = None) -> None:
        self.slurm = slurm
        self.kubernetes = kubernetes
        self.slurm_reader = slurm_reader

    async def execute(self, action: OpenAction, node: NodeState | None) -> bool:
        if action.side == wk.OWNER_SLURM:
            return await self._slurm(action)
        if action.side == wk.OWNER_KUBERNETES:
            k8s_name = (_arg(action, "k8s_node")
                        or (node.k8s_name if node is not None else None) or action.node)
            if action.verb == VERB_UNLOCK:
                await self._check_drained(
                    action.node, out_of_contact=_arg(action, SLURMD_GONE_ARG) == "1")
            if action.verb == VERB_SLURMD_DELETE:
                # Killing slurmd under a job leaves the node busy until SlurmdTimeout: ask
                # Slurm right before. A repair's delete (a Failed or unregistered pod:
                # Slurm does not hear that slurmd) accepts the node out of contact, never
                # without DRAIN or with an allocation.
                await self._check_drained(
                    action.node, "delete the slurmd pod of",
                    out_of_contact=_arg(action, SLURMD_REPAIR_ARG) == "1")
            if action.verb == VERB_SLURMD_LABEL and _arg(action, BUSY_ARG) != "1":
                await self._check_idle(action.node)
            return await self._kubernetes(action, k8s_name)
        raise ActionError(f"unknown side {action.side!r}", retryable=False)

    async def _slurm_now(self, node: str, refusing: str, confirm: str) -> SlurmNode | None:
        """Slurm's answer for `node` now (None: not in it), read right before an action
        that must `confirm` a state; refused without a reader or an answer (fail closed)."""
        if self.slurm_reader is None:
            raise ActionError(f"{refusing}: no Slurm reader to confirm it is {confirm}",
                              retryable=True)
        try:
            nodes = await self.slurm_reader.get_nodes()
        except Exception as error:
            raise ActionError(f"cannot confirm {node} is {confirm} in Slurm: {error}",
                              retryable=True) from error
        return next((item for item in nodes if item.name == node), None)

    async def _check_drained(self, node: str, what: str = "unlock", *,
                             out_of_contact: bool = False) -> None:
        """Defence in depth for the one unsafe action: the policy decided to unlock on
        an observation up to a poll interval old, so ask Slurm again right before
        handing the node to Kubernetes (DRAIN, nothing allocated, not completing). Without
        a Slurm reader it cannot ask, so it refuses (fail closed). `out_of_contact`: the
        policy saw sunkd's slurmd pod gone from the drained node (`slurmdgone`), so Slurm
        not hearing it is expected; DRAIN and no allocation are still required."""
        current = await self._slurm_now(node, f"refusing to {what} {node}", "drained")
        if current is not None and out_of_contact and current.is_drain \
                and not current.is_busy:
            return
        if current is None or not current.is_drained:
            state = current.display_state if current is not None else "missing"
            raise ActionError(f"refusing to {what} {node}: Slurm now reports it {state}, "
                              "not drained", retryable=True)

    async def _check_idle(self, node: str) -> None:
        """Before the busy label comes off a slurmd pod (the PDB then lets an eviction
        through): Slurm must report the node, in contact, with nothing allocated or
        completing, now. Without a Slurm reader it cannot ask, so it refuses."""
        what = f"refusing to unlabel the slurmd pod of {node}"
        current = await self._slurm_now(node, what, "idle")
        if current is None or current.is_busy or not in_contact(current.to_observed()):
            state = current.display_state if current is not None else "missing"
            raise ActionError(f"{what}: Slurm now reports it {state}", retryable=True)

    async def _slurm(self, action: OpenAction) -> bool:
        if self.slurm is None:
            raise ActionError("no Slurm actuator configured (slurm.url unset)", retryable=True)
        if action.verb == VERB_DRAIN:
            return await self.slurm.drain(action.node, _arg(action, "reason") or action.reason)
        if action.verb == VERB_RESUME:
            # The drain the policy saw: the actuator refuses if it changed since.
            when = _arg(action, "expect_reason_time")
            return await self.slurm.resume(
                action.node, expect_reason=_arg(action, "expect_reason") or None,
                expect_reason_time=float(when) if when else None,
                return_to_service=_arg(action, RETURN_TO_SERVICE_ARG) == "1")
        if action.verb == VERB_DELETE_NODE:
            feature = _arg(action, FEATURE_ARG)
            if not feature:
                raise ActionError(f"delete-node {action.node}: no feature argument",
                                  retryable=False)
            if not await self._check_defunct(action.node, feature):
                return False  # Slurm no longer lists it: already so
            return await self.slurm.delete_node(action.node, feature=feature)
        raise ActionError(f"unknown Slurm verb {action.verb!r}", retryable=False)

    async def _check_defunct(self, node: str, feature: str) -> bool:
        """Before a defunct Dynamic record is deleted (`domain/slurmddefunct.py`), ask
        Slurm again: the node DYNAMIC_NORM with the Nodeset's `feature`, DOWN and
        NOT_RESPONDING, nothing allocated or completing, and no job in Slurm's job list
        (not ended) running on it or requiring it (`--nodelist`). False: Slurm no longer
        lists the node. Refused (retryable) otherwise, and without a reader of both."""
        what = f"refusing to delete the Slurm node record {node}"
        current = await self._slurm_now(node, what, "defunct")
        if current is None:
            return False
        why = slurm_problem(current.to_observed(), feature)
        if why:
            raise ActionError(f"{what}: Slurm now reports it {current.display_state} "
                              f"(features {','.join(current.features) or 'none'}): {why}",
                              retryable=True)
        get_jobs = getattr(self.slurm_reader, "get_jobs", None)
        if get_jobs is None:
            raise ActionError(f"{what}: no Slurm job reader to confirm no job needs it",
                              retryable=True)
        try:
            jobs: list[SlurmJob] = await get_jobs()
        except Exception as error:
            raise ActionError(f"{what}: cannot read Slurm's jobs: {error}",
                              retryable=True) from error
        needing = sorted(job.job_id for job in jobs if job.state not in ENDED_JOB_STATES
                         and (node in job.nodes or node in job.required_nodes))
        if needing:
            raise ActionError(f"{what}: job(s) {', '.join(map(str, needing[:5]))} run on "
                              "it or require it", retryable=True)
        return True

    async def _kubernetes(self, action: OpenAction, node: str) -> bool:
        actuator = self.kubernetes
        if actuator is None:
            raise ActionError("no Kubernetes actuator configured", retryable=True)
        if action.verb == VERB_LOCK:
            return await actuator.lock(node)
        if action.verb == VERB_UNLOCK:
            return await actuator.unlock(node)
        if action.verb == VERB_HOLD:
            state = _arg(action, "slurm_state")
            reason = _arg(action, "slurm_reason")
            annotated = await actuator.annotate(
                node, {wk.ANNOTATION_SLURM_STATE: state, wk.ANNOTATION_SLURM_REASON: reason})
            held = await actuator.hold(node, action.reason)
            return annotated or held
        if action.verb == VERB_RELEASE:
            released = await actuator.release(node)
            cleared = await actuator.annotate(
                node, {wk.ANNOTATION_SLURM_STATE: None, wk.ANNOTATION_SLURM_REASON: None})
            return released or cleared
        if action.verb == VERB_WARN:
            # The policy's "say why": a Warning Event on the node (kubectl describe node).
            # The Event is the whole effect: one the API server did not take fails the
            # action (ActionError), so the policy asks again instead of waiting as if said.
            log.warning("executor.warn", node=node, reason=action.reason)
            return await actuator.post_event(
                node, _arg(action, "event_reason") or wk.EVENT_CONFLICT,
                _arg(action, "message") or action.reason, type="Warning")
        if action.verb == VERB_EVICT:
            changed = False
            # "pod_uid" args are "<namespace>/<name>=<uid>": evict exactly the pod decided
            # on, and only while it is on this node (safety scenario 10).
            uids = dict(item.rpartition("=")[::2] for item in _args(action, "pod_uid"))
            for pod in _args(action, "pod"):
                namespace, _, name = pod.partition("/")
                if not name:
                    raise ActionError(f"bad pod argument {pod!r}", retryable=False)
                changed = await actuator.evict(
                    namespace, name, uid=uids.get(pod) or None, node=node) or changed
            return changed
        if action.verb in (VERB_SLURMD_CREATE, VERB_SLURMD_DELETE, VERB_SLURMD_LABEL,
                           VERB_FINALIZER_ADD, VERB_FINALIZER_REMOVE):
            args = {label.key: label.value for label in action.args}
            return await actuator.slurmd(action.verb, action.node, node, args)
        raise ActionError(f"unknown Kubernetes verb {action.verb!r}", retryable=False)
