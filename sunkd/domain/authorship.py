"""Proof of authorship: what sunkd wrote on a node, as its own log records it.

sunkd may lift only what it made (docs/safety.md, invariant I2). The `sunkd:` reason
prefix and the `sunkd.io/slurm-hold` taint key are conventions anyone can copy (an
administrator's `scontrol update reason="sunkd: ..."`, an operator's `kubectl taint`
copied from a held node), so they are necessary, never sufficient. The proof is a *mark*
the fold keeps per node:

- a drain: when sunkd's drain of a node succeeds, the exact reason it wrote (the request's
  `reason` argument, normalised as the Slurm actuator writes it); then, from the first Slurm
  observation showing that reason on the drained node, Slurm's reason time;
- a hold: when sunkd's hold succeeds, the exact taint the Kubernetes actuator writes.

A mark is *seen* once an observation shows it (Slurm 24.11 and later append " : Not
responding" to the reason of a drained node that loses contact: that shows it too, only
while the node is out of contact). From then on every observation must show
it unchanged (the same text, the same whole second of reason time; the one hold taint),
or the mark is dropped for good: someone undrained, re-drained or edited it, and what is
there now is theirs even when the text is sunkd's. Until it is seen, an observation that
does not show it is ignored for `CATCHUP_SECONDS` (a poll or a watch event read before the
write can be appended after its success), then drops it. sunkd's own undrain or unhold
drops it too, and so does the node vanishing from that side, with one delay: a poll read
before sunkd's undrain can be appended after its success, still showing the drain. For
`CATCHUP_SECONDS` after the undrain the mark is kept as *lifted*: an observation showing
exactly that drain (its text and reason time) is sunkd's drain on its way out, neither
foreign nor sunkd's to act on (`drain_lifting`); the first one without it, or one with
another reason time, drops the mark.

A write that failed in a way that may have landed (a timeout, an unconfirmed write: a
retryable failure) is marked like a success: the policy retries it, and a landed write
left unmarked would be a foreign hold sunkd made itself. A drain mark not yet seen takes
only a reason Slurm set by `CATCHUP_SECONDS` after the outcome.

What the marks leave open: an exact copy written while sunkd's own write of it is in
flight (between the decision and the write: the actuator finds "already so" and the
success adopts it; or after a retryable failure, before sunkd next sees the node), and a
drain undone and put back with the same text within the second of sunkd's own (Slurm's
reason time has whole seconds). Taints carry no time, so a hold taint removed and put
back by hand between two of sunkd's looks at the node is taken for sunkd's.
"""

from __future__ import annotations

from typing import NamedTuple

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sNodeObserved, Label, SlurmNodeObserved
from sunkd.domain.slurmnode import in_contact

# A poll or watch event read before a write and appended after its success is this
# late at most (the policy's own wait for an action's observation, OBSERVATION_CATCHUP).
CATCHUP_SECONDS = 60.0
# Slurm keeps a reason time as a time_t (`reason_time` in src/slurmctld/slurmctld.h): whole
# seconds. Two reads of one reason show the same second; a reason set again, even one
# second later, shows another. Half a second absorbs only the rounding of a time carried
# as text (the planner's `expect_reason_time`).
REASON_TIME_TOLERANCE = 0.5
# What Slurm 24.11 and later append to a drained node's reason when it stops responding
# (`set_node_down_ptr` in src/slurmctld/node_mgr.c keeps the reason and adds the cause).
NOT_RESPONDING_SUFFIX = " : Not responding"

# The actions whose outcomes make or drop a mark ("side/verb", as in NodeState.outcomes).
DRAIN = f"{wk.OWNER_SLURM}/drain"
UNDRAIN = f"{wk.OWNER_SLURM}/resume"
HOLD = f"{wk.OWNER_KUBERNETES}/cordon"
UNHOLD = f"{wk.OWNER_KUBERNETES}/uncordon"


class DrainMark(NamedTuple):
    """A Slurm drain sunkd wrote: its exact reason and, once seen, Slurm's reason time."""

    reason: str
    reason_time: float | None
    seen: bool
    at: float  # when the write's outcome was logged
    lifted: float | None = None  # when sunkd's undrain of it succeeded


class HoldMark(NamedTuple):
    """sunkd's hold taint on a Kubernetes node (`sunkd.io/slurm-hold=slurm:NoSchedule`)."""

    key: str
    value: str
    effect: str
    seen: bool
    at: float


def written_reason(reason: str) -> str:
    """The reason exactly as the Slurm actuator writes it: one line, `sunkd:` first."""
    reason = " ".join(reason.split())  # scontrol and slurm.conf do not like newlines
    if reason.startswith(wk.REASON_PREFIX):
        return reason
    return f"{wk.REASON_PREFIX} {reason}" if reason else f"{wk.REASON_PREFIX} drained"


def requested_reason(args: tuple[Label, ...], reason: str) -> str:
    """The reason a drain request writes: its `reason` argument, else the request's own
    reason (as the executor reads it; logs of every sunkd version carry the argument)."""
    for label in args:
        if label.key == "reason" and label.value:
            return written_reason(label.value)
    return written_reason(reason)


def hold_taint() -> tuple[str, str, str]:
    """(key, value, effect) of the taint `cordon` writes."""
    return wk.TAINT_HOLD, wk.OWNER_SLURM, wk.TAINT_OWNER_EFFECT


def drain_shows(mark: DrainMark, observation: SlurmNodeObserved | None) -> bool:
    """The observation shows exactly the drain `mark` records (not one sunkd lifted)."""
    return mark.lifted is None and _shows(mark, observation)


def drain_lifting(mark: DrainMark | None, observation: SlurmNodeObserved | None) -> bool:
    """The observation shows exactly the drain sunkd has just undrained (read before the
    undrain): sunkd's, on its way out. Neither foreign nor to act on."""
    return mark is not None and mark.lifted is not None and _shows(mark, observation)


def drain_lifted(mark: DrainMark | None, observation: SlurmNodeObserved | None,
                 at: float) -> DrainMark | None:
    """The mark after sunkd's undrain succeeded at `at`: kept as lifted while the node's
    last observation still shows it (a poll read before the undrain may follow), else
    dropped. A mark never seen has no reason time to tell a stale view from a new drain:
    dropped."""
    if mark is None or not mark.seen or not _shows(mark._replace(lifted=None), observation):
        return None
    return mark._replace(lifted=at)


def _shows(mark: DrainMark, observation: SlurmNodeObserved | None) -> bool:
    if observation is None or "DRAIN" not in observation.flags:
        return False
    if (observation.reason == mark.reason + NOT_RESPONDING_SUFFIX
            and not in_contact(observation)):
        # Slurm 24.11+ appended its cause to sunkd's reason (and set it anew: its time,
        # "set by" slurm) when the node lost contact: sunkd's, while out of contact, and
        # not set before sunkd's own drain.
        return (mark.reason_time is None or observation.reason_time is None
                or observation.reason_time >= mark.reason_time - REASON_TIME_TOLERANCE)
    if observation.reason != mark.reason:
        return False
    if mark.reason_time is None or observation.reason_time is None:
        return mark.reason_time is None
    return abs(observation.reason_time - mark.reason_time) <= REASON_TIME_TOLERANCE


def hold_shows(mark: HoldMark, observation: K8sNodeObserved | None) -> bool:
    """The node carries exactly one hold-key taint, and it is the one `mark` records."""
    if observation is None:
        return False
    holds = [t for t in observation.taints if t.key == mark.key]
    return len(holds) == 1 and (holds[0].value, holds[0].effect) == (mark.value, mark.effect)


def drain_written(reason: str, observation: SlurmNodeObserved | None, at: float) -> DrainMark:
    """The mark of a drain sunkd wrote at `at`; seen at once when the node's observation
    already shows the text (appended before the outcome: it came after the write)."""
    mark = DrainMark(reason, None, False, at)
    if observation is not None and "DRAIN" in observation.flags and observation.reason == reason:
        return mark._replace(reason_time=observation.reason_time, seen=True)
    return mark


def _written_by_then(mark: DrainMark, observation: SlurmNodeObserved) -> bool:
    """The reason was set no later than the outcome was logged (give or take a catch-up of
    clock skew between slurmctld and the database): a drain set later is someone else's."""
    return (observation.reason_time is None
            or observation.reason_time <= mark.at + CATCHUP_SECONDS)


def hold_written(observation: K8sNodeObserved | None, at: float) -> HoldMark:
    key, value, effect = hold_taint()
    mark = HoldMark(key, value, effect, False, at)
    return mark._replace(seen=True) if hold_shows(mark, observation) else mark


def follow_drain(mark: DrainMark, observation: SlurmNodeObserved, at: float) -> DrainMark | None:
    """The mark after a Slurm observation at `at` (None: it is no longer sunkd's)."""
    if mark.lifted is not None:
        if at - mark.lifted < CATCHUP_SECONDS and drain_lifting(mark, observation):
            return mark
        return None
    if not mark.seen:
        if ("DRAIN" in observation.flags and observation.reason == mark.reason
                and _written_by_then(mark, observation)):
            return mark._replace(reason_time=observation.reason_time, seen=True)
        return mark if at - mark.at < CATCHUP_SECONDS else None
    return mark if drain_shows(mark, observation) else None


def follow_hold(mark: HoldMark, observation: K8sNodeObserved, at: float) -> HoldMark | None:
    """The mark after a Kubernetes observation at `at` (None: it is no longer sunkd's)."""
    if hold_shows(mark, observation):
        return mark if mark.seen else mark._replace(seen=True)
    if not mark.seen and at - mark.at < CATCHUP_SECONDS:
        return mark
    return None
