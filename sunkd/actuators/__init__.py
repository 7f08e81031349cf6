"""Actuators: idempotent side effects on Slurm (drain/resume) and Kubernetes (taint,
cordon, evict, status, Events).

Every actuator method is idempotent and returns whether it changed anything
(`False` = the world already was as wanted). Failures raise `ActionError`, whose
`retryable` flag tells the outbox whether to try again later (a PDB's 429, a 409
race that ran out of retries, a timeout) or to give up and record why (a foreign
drain, a missing node, a permission error).
"""

from __future__ import annotations


class ActionError(Exception):
    """An action could not be carried out."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class RefusedError(ActionError):
    """sunkd refused on purpose: the target is not ours to change (foreign drain or
    cordon). Never retried; the outbox records it and emits a warning."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
