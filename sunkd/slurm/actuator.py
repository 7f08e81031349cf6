"""Slurm actuator: drain and resume one node, idempotently, and only our own drains.

This is the only code that changes Slurm. Two transports, picked by what the server
can do: `POST /slurm/vX/node/{name}` where the negotiated REST version has it (v0.0.39,
Slurm 23.02, and newer), else `scontrol update nodename=X ...` (22.05's REST is
read-only for nodes: 405). Every reason sunkd writes starts with `sunkd:`; that prefix
is the last check `resume` makes before undoing a drain (Slinky's slurm-operator uses the
same trick with its own prefix). It is necessary, not sufficient: the policy asks to
undrain only what sunkd's log proves it wrote (`sunkd.domain.authorship`), and passes the
reason and reason time it proved, which `resume` checks again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import structlog

from sunkd.domain import wellknown as wk
from sunkd.domain.authorship import REASON_TIME_TOLERANCE, written_reason
from sunkd.domain.ownership import is_ours
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.domain.slurmddefunct import slurm_problem
from sunkd.domain.slurmnode import INVALID_REG, KIND_FLAGS, slurm_unhealthy
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import (
    SlurmApiError,
    SlurmAuthError,
    SlurmError,
    SlurmNode,
    SlurmPayloadError,
    SlurmTimeoutError,
    SlurmUnavailableError,
)
from sunkd.slurm.scontrol import SCONTROL_TIMEOUT, run_scontrol

log = structlog.get_logger(__name__)


__all__ = ["SlurmActuator", "is_our_reason", "our_reason"]


def our_reason(reason: str) -> str:
    """`reason` with the `sunkd:` prefix enforced (added when missing): exactly the text
    the fold records as sunkd's drain (`authorship.written_reason`)."""
    return written_reason(reason)


is_our_reason = is_ours  # one test of "sunkd wrote this reason", in domain/ownership


class SlurmActuator:
    """`drain(node, reason)` / `resume(node)`; True = changed, False = already so.

    Failures raise `ActionError` (retryable for timeouts and a down controller) or
    `RefusedError` (the node carries someone else's word).

    Safety (docs/safety.md, invariant I2): a reason that does not start with `sunkd:` on a
    drained or unhealthy node is foreign whatever the flags (`scontrol update state=down
    reason=...` sets no DRAIN), and is never overwritten; sunkd removes its drains with
    `UNDRAIN`, which clears only DRAIN (as Slinky's slurm-operator does), never `RESUME`,
    which would also return an admin's DOWN or FAIL to service. Each write re-checks
    leadership (`may_write`) right before it, is bounded by `write_timeout` (below the
    lease's safety margin) and is confirmed by reading the node again.
    """

    def __init__(
        self,
        client: SlurmRestClient,
        *,
        scontrol: str = "scontrol",
        scontrol_env: Mapping[str, str] | None = None,
        prefer_rest: bool = True,
        may_write: Callable[[], bool] | None = None,
        write_timeout: float = SCONTROL_TIMEOUT,
    ) -> None:
        self._client = client
        self._scontrol = scontrol
        self._env = dict(scontrol_env) if scontrol_env is not None else None
        self._prefer_rest = prefer_rest
        self._may_write = may_write
        self._write_timeout = write_timeout

    @property
    def transport(self) -> str:
        """`rest` or `scontrol` (after the client negotiated)."""
        if self._prefer_rest and self._client.can_update_nodes:
            return "rest"
        return "scontrol"

    async def drain(self, node: str, reason: str) -> bool:
        reason = our_reason(reason)
        current = await self._read(node)
        if current.is_drain and current.reason == reason:
            return False
        if _foreign_word(current):
            # Overwriting it would make the drain look like ours, and a later undrain
            # would then undo an administrator's drain (or hide their DOWN reason).
            raise RefusedError(
                f"{node} is already {current.display_state} by "
                f"{current.reason_set_by or 'someone else'} with reason {current.reason!r}; "
                "not taking it over"
            )
        await self._update(node, "DRAIN", reason)
        confirmed = await self._read(node)
        if not (confirmed.is_drain and confirmed.reason == reason):
            raise ActionError(
                f"drain of {node} not confirmed: Slurm now reports {confirmed.display_state} "
                f"with reason {confirmed.reason!r}",
                retryable=True,
            )
        log.info("slurm.drain", node=node, reason=reason, transport=self.transport)
        return True

    async def resume(
        self, node: str, *, expect_reason: str | None = None,
        expect_reason_time: float | None = None, return_to_service: bool = False,
    ) -> bool:
        """Remove sunkd's drain with UNDRAIN. `expect_reason` (and its time) is what the
        policy saw when it decided: if the reason changed since (an admin re-drained the
        node with a reason of their own, or edited ours), refuse instead of undoing it.

        `return_to_service`: the policy saw sunkd's own slurmd pod registered on a node
        Slurm left DOWN under sunkd's drain (its slurmd was away while lent; slurmctld's
        ReturnToService=1 returns a DOWN node on registration only when its reason is
        "Not responding", `validate_node_specs` in src/slurmctld/node_mgr.c). UNDRAIN
        would leave it DOWN for good, so that DOWN, and only it, is resumed with RESUME:
        sunkd's reason with the very reason time sunkd's drain set (a DOWN set since, even
        with sunkd's text, has a new one), and slurmctld hears the node (no
        NOT_RESPONDING, nothing else wrong with it)."""
        current = await self._read(node)
        if not current.is_drain:
            return False
        if not is_our_reason(current.reason):
            raise RefusedError(
                f"{node} is drained by {current.reason_set_by or 'someone else'} with reason "
                f"{current.reason!r} (not {wk.REASON_PREFIX}...); not undraining a foreign drain"
            )
        if INVALID_REG in current.flags:
            # slurmctld refuses UNDRAIN and RESUME while it is on
            # (`_valid_node_state_change` in src/slurmctld/node_mgr.c): the policy holds
            # such a node, so this is a decision read before the flag came.
            raise RefusedError(
                f"{node} is {current.display_state}: slurmctld refused its slurmd "
                "registration and refuses an undrain until a valid one; not undraining")
        if expect_reason is not None and current.reason != expect_reason:
            raise RefusedError(
                f"{node}'s drain reason changed since the decision: expected "
                f"{expect_reason!r}, found {current.reason!r}; not undraining"
            )
        if (
            expect_reason_time is not None
            and current.reason_time is not None
            and abs(current.reason_time - expect_reason_time) > REASON_TIME_TOLERANCE
        ):
            raise RefusedError(
                f"{node}'s drain reason was set again since the decision (at "
                f"{current.reason_time:.0f}, expected {expect_reason_time:.0f}); not undraining"
            )
        if return_to_service and current.state.upper() == "DOWN":
            return await self._return_to_service(node, current, expect_reason_time)
        # UNDRAIN clears DRAIN only: DOWN, FAIL and their reasons stay Slurm's. Right after
        # it slurmctld may show the node idle+NOT_RESPONDING for ~1 s until its next ping.
        await self._update(node, "UNDRAIN", None)
        confirmed = await self._read(node)
        if confirmed.is_drain:
            raise ActionError(
                f"undrain of {node} not confirmed: Slurm still reports "
                f"{confirmed.display_state} ({confirmed.reason!r})",
                retryable=True,
            )
        log.info("slurm.undrain", node=node, transport=self.transport)
        return True

    async def _return_to_service(self, node: str, current: SlurmNode,
                                 expect_reason_time: float | None) -> bool:
        trouble = sorted(current.flags - {"DRAIN"} - KIND_FLAGS)
        if trouble:
            raise RefusedError(
                f"{node} is {current.display_state} ({'+'.join(trouble)}): slurmctld does "
                "not hear a healthy slurmd there; not returning it to service")
        if expect_reason_time is None or current.reason_time is None:
            raise RefusedError(
                f"{node} is DOWN with reason {current.reason!r} and no reason time to prove "
                "it is the DOWN sunkd's drain left; not returning it to service")
        await self._update(node, "RESUME", None)
        confirmed = await self._read(node)
        if confirmed.is_drain or confirmed.state.upper() == "DOWN":
            raise ActionError(
                f"return to service of {node} not confirmed: Slurm now reports "
                f"{confirmed.display_state} ({confirmed.reason!r})", retryable=True)
        log.info("slurm.return_to_service", node=node, transport=self.transport)
        return True

    async def delete_node(self, node: str, *, feature: str) -> bool:
        """Delete a defunct Dynamic node record (`DELETE /slurm/vX/node/{name}`, Slurm
        23.02+). True = deleted, False = already gone. The policy asks only for a record
        of a Nodeset's `feature` whose slurmd pod sunkd created and which is gone with its
        Kubernetes Node (`domain/slurmddefunct.py`), and the executor asked Slurm's nodes
        and jobs again; this reads the node once more right before and refuses anything
        but a DYNAMIC_NORM record with the feature, DOWN+NOT_RESPONDING, nothing
        allocated or completing. slurmctld deletes only dynamic nodes and refuses one with
        jobs itself (`delete_nodes` in src/slurmctld/node_mgr.c).

        22.05's slurmrestd (v0.0.38) has no node delete: refused (never retried soon) with
        the line an administrator can run; sunkd never runs scontrol for it."""
        if not self._client.can_delete_nodes:
            raise RefusedError(
                f"{node} is a defunct Dynamic node record, but slurmrestd "
                f"{self._client.version} has no node delete (DELETE /slurm/v0.0.39/node/"
                "{name}, Slurm 23.02+); an administrator can run "
                f"`scontrol delete nodename={node}`")
        try:
            current = await self._client.get_node(node)
        except SlurmApiError as error:
            if _is_unknown_node(error):
                return False
            raise ActionError(f"reading {node}: {error}", retryable=True) from error
        except SlurmAuthError as error:
            raise ActionError(f"reading {node}: {error}", retryable=False) from error
        except SlurmError as error:
            raise ActionError(f"reading {node}: {error}", retryable=True) from error
        why = _not_defunct(current, feature)
        if why:
            raise RefusedError(f"not deleting {node}: Slurm now reports it {why}")
        if self._may_write is not None and not self._may_write():
            raise ActionError(f"delete {node}: not (or no longer safely) the leader; "
                              "not writing", retryable=True)
        try:
            await asyncio.wait_for(self._client.delete_node(node), self._write_timeout)
        except TimeoutError as error:
            raise ActionError(f"delete {node}: no answer within {self._write_timeout:g} s",
                              retryable=True) from error
        except SlurmAuthError as error:
            raise ActionError(f"delete {node}: {error} (deleting nodes needs SlurmUser, "
                              "root or AdminLevel=Operator)", retryable=False) from error
        except SlurmApiError as error:
            if not _is_unknown_node(error):
                raise ActionError(f"delete {node}: {error}",
                                  retryable=error.status >= 500) from error
        except SlurmError as error:
            raise ActionError(f"delete {node}: {error}", retryable=True) from error
        try:
            await self._client.get_node(node)
        except SlurmApiError as error:
            if _is_unknown_node(error):
                log.info("slurm.delete_node", node=node, feature=feature)
                return True
            raise ActionError(f"delete of {node} not confirmed: {error}",
                              retryable=True) from error
        except SlurmError as error:
            raise ActionError(f"delete of {node} not confirmed: {error}",
                              retryable=True) from error
        raise ActionError(f"delete of {node} not confirmed: Slurm still reports it",
                          retryable=True)

    # ----------------------------------------------------------------- internals

    async def _read(self, node: str) -> SlurmNode:
        try:
            # The single-node GET has current DRAIN flags and reason (its allocation
            # counts can lag on 22.05, which these decisions do not use).
            return await self._client.get_node(node)
        except SlurmApiError as error:
            if _is_unknown_node(error):
                raise ActionError(f"no Slurm node named {node!r}", retryable=False) from error
            raise ActionError(f"reading {node}: {error}", retryable=True) from error
        except SlurmAuthError as error:
            raise ActionError(f"reading {node}: {error}", retryable=False) from error
        except (SlurmTimeoutError, SlurmUnavailableError, SlurmPayloadError) as error:
            raise ActionError(f"reading {node}: {error}", retryable=True) from error
        except SlurmError as error:
            raise ActionError(f"reading {node}: {error}", retryable=True) from error

    async def _update(self, node: str, state: str, reason: str | None) -> None:
        if self._may_write is not None and not self._may_write():
            raise ActionError(
                f"{state} {node}: not (or no longer safely) the leader; not writing",
                retryable=True,
            )
        if self.transport == "rest":
            try:
                await asyncio.wait_for(
                    self._client.update_node(node, state=state, reason=reason),
                    self._write_timeout,
                )
            except TimeoutError as error:
                raise ActionError(
                    f"{state} {node}: no answer within {self._write_timeout:g} s", retryable=True
                ) from error
            except SlurmAuthError as error:
                raise ActionError(
                    f"{state} {node}: {error} (updating nodes needs SlurmUser, root or "
                    "AdminLevel=Operator)",
                    retryable=False,
                ) from error
            except SlurmApiError as error:
                raise ActionError(
                    f"{state} {node}: {error}", retryable=error.status >= 500
                ) from error
            except SlurmError as error:
                raise ActionError(f"{state} {node}: {error}", retryable=True) from error
            return
        await self._scontrol_update(node, state, reason)

    async def _scontrol_update(self, node: str, state: str, reason: str | None) -> None:
        # One node per call: a multi-node update that fails on one node still applies
        # to the others (docs/slurm.md, "Measured behaviour").
        args = ["update", f"nodename={node}", f"state={state.lower()}"]
        if reason is not None:
            args.append(f"reason={reason}")
        await run_scontrol(
            self._scontrol, args, what=f"scontrol update nodename={node} state={state.lower()}",
            env=self._env, limit=self._write_timeout,
            missing=f" and slurmrestd {self._client.version} has no node update (install "
                    "slurm-client and munge, or run Slurm >= 23.02 for REST node updates)")


def _foreign_word(node: SlurmNode) -> bool:
    """Someone else's reason that still means something: on a drained node, or on one
    Slurm reports unhealthy (DOWN, FAIL, NOT_RESPONDING ...). A stale reason on a healthy,
    undrained node (24.11 keeps the old text after a RESUME) protects nothing."""
    if not node.reason or is_our_reason(node.reason):
        return False
    return node.is_drain or slurm_unhealthy(node.to_observed())


def _not_defunct(node: SlurmNode, feature: str) -> str:
    """Why `node` is not a defunct record of the Nodeset whose feature is `feature` ("":
    it is), by the policy's own rule (`slurmddefunct.slurm_problem`)."""
    why = slurm_problem(node.to_observed(), feature)
    return f"{node.display_state} (features {','.join(node.features) or 'none'}): {why}" \
        if why else ""


def _is_unknown_node(error: SlurmApiError) -> bool:
    # 22.05: 500 errno 2018 "Invalid node name specified"; 24.11+: 200 with
    # errors[] "Failure to query node" (error_number 0) and no nodes.
    if 2018 in error.error_numbers:
        return True
    text = str(error).lower()
    return "invalid node name" in text or "failure to query node" in text or error.status == 404
