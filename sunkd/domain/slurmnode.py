"""What a Slurm node observation means: the one vocabulary for busy, drained, usable,
unhealthy and in contact.

The policy, the executor's re-check right before a handover, utilization, the simulator,
the extender and Nodeset status all ask these questions; each answer is defined here
once, so the policy can never request a handover the executor then refuses forever (or
the reverse). Every predicate takes a `SlurmNodeObserved` (`SlurmNode.to_observed()`
gives one for a fresh read) and answers False for "no observation": uncertainty fails
closed.

Slurm facts these rest on (slurm.conf(5), scontrol(1), `node_state_string()` in
src/common/slurm_protocol_defs.c):
- the base state is one of IDLE, ALLOCATED, MIXED, DOWN, ERROR, FUTURE, UNKNOWN (and
  COMPLETING, PLANNED, RESERVED in some REST renderings); flags ride on it (DRAIN,
  COMPLETING, NOT_RESPONDING, FAIL, POWERED_DOWN, ...);
- slurmctld prints DRAINED only for a DRAIN node with nothing allocated and nothing
  completing; DRAINING otherwise; UNDRAIN can linger beside DRAIN after an undrain;
- NOT_RESPONDING (the `*` of sinfo) means slurmctld lost contact with slurmd: job steps
  may still run there, and slurmctld cannot tell;
- INVALID_REG means slurmctld refused the node's last registration: slurmd reported fewer
  CPUs, less memory or other GRES than the node's `NodeName=` line (`validate_node_specs`
  in src/slurmctld/node_mgr.c; not with `SlurmdParameters=config_overrides`). slurmctld
  drains the node with its reason (unless DOWN, DRAIN or FAIL already; 24.11 and later
  also put the reason over an existing one), refuses UNDRAIN and RESUME while the flag is
  on (`_valid_node_state_change`), and clears it only at the next valid registration.
  The same on 22.05.8, 24.11.5 and 26.05.5 through slurmrestd (flag `INVALID_REG`).
"""

from __future__ import annotations

from sunkd.domain.events import SlurmNodeObserved

__all__ = [
    "KIND_FLAGS",
    "KNOWN_USABLE_STATES",
    "UNHEALTHY_FLAGS",
    "UNHEALTHY_STATES",
    "drain_requested",
    "in_contact",
    "registered",
    "registration_refused",
    "slurm_busy",
    "slurm_drained",
    "slurm_unhealthy",
    "slurm_usable",
]

# Slurm conditions that make a node unusable regardless of drains.
UNHEALTHY_STATES = frozenset({"DOWN", "UNKNOWN", "FUTURE", "ERROR"})
UNHEALTHY_FLAGS = frozenset(
    {"FAIL", "NOT_RESPONDING", "INVALID", "INVALID_REG", "POWERED_DOWN", "POWERING_DOWN",
     "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
)
# Flags that say what kind of node it is, for its whole life, not how it is: DYNAMIC_NORM
# marks a node a dynamic registration (`slurmd -Z`) created (`create_dynamic_reg_node` in
# src/slurmctld/node_mgr.c). Nothing is wrong with a node for carrying one.
KIND_FLAGS = frozenset({"DYNAMIC_NORM"})
# Base states Slurm prints for a usable node; any other base state, including one this
# sunkd does not know (a newer Slurm, a broken proxy), is unhealthy.
KNOWN_USABLE_STATES = frozenset(
    {"IDLE", "ALLOCATED", "MIXED", "COMPLETING", "PLANNED", "RESERVED"})
# slurmctld refused the node's last slurmd registration (module docstring).
INVALID_REG = "INVALID_REG"
_BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
# slurmctld has no live slurmd to speak for the node: it cannot vouch that nothing runs.
_OUT_OF_CONTACT_STATES = frozenset({"DOWN", "UNKNOWN", "FUTURE"})
_OUT_OF_CONTACT_FLAGS = frozenset(
    {"NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP"})


def slurm_unhealthy(observation: SlurmNodeObserved) -> bool:
    """Slurm reports the node itself broken (DOWN, FAIL, NOT_RESPONDING, ...), or in a
    state sunkd does not know."""
    state = observation.state.upper()
    if state in UNHEALTHY_STATES or state not in KNOWN_USABLE_STATES:
        return True
    return not UNHEALTHY_FLAGS.isdisjoint(observation.flags)


def slurm_busy(observation: SlurmNodeObserved) -> bool:
    """Jobs run or clean up on the node: ALLOCATED, MIXED or COMPLETING (base state or
    flag), or CPUs allocated."""
    return (observation.state.upper() in _BUSY_STATES or "COMPLETING" in observation.flags
            or observation.alloc_cpus > 0)


def in_contact(observation: SlurmNodeObserved | None) -> bool:
    """slurmctld hears from the node's slurmd, so what it reports about jobs there is
    current: not DOWN/UNKNOWN/FUTURE, not NOT_RESPONDING, not powered down or powering.
    No grace: a slurmd that died a second ago may leave job steps running."""
    return (observation is not None
            and observation.state.upper() not in _OUT_OF_CONTACT_STATES
            and _OUT_OF_CONTACT_FLAGS.isdisjoint(observation.flags))


def drain_requested(observation: SlurmNodeObserved | None) -> bool:
    """DRAIN is set and no UNDRAIN pending beside it."""
    return (observation is not None and "DRAIN" in observation.flags
            and "UNDRAIN" not in observation.flags)


def slurm_drained(observation: SlurmNodeObserved | None) -> bool:
    """The one definition of "safe to hand to Kubernetes": Slurm reports the node
    drained (DRAIN, no UNDRAIN), nothing allocated or completing, in contact, and its
    registration not refused (INVALID_REG: a node held as Slurm's trouble is not lent,
    whatever an older view said; the executor asks this again right before). No
    observation (never seen, vanished) is never drained."""
    return (drain_requested(observation) and observation is not None
            and not slurm_busy(observation) and in_contact(observation)
            and not registration_refused(observation))


def slurm_usable(observation: SlurmNodeObserved | None) -> bool:
    """Slurm can schedule jobs on the node: not drained, not broken."""
    return (
        observation is not None
        and "DRAIN" not in observation.flags
        and observation.state.upper() in KNOWN_USABLE_STATES
        and not slurm_unhealthy(observation)
    )


def registered(observation: SlurmNodeObserved | None) -> bool:
    """Slurm has the node and has heard from its slurmd: not a slot that never registered
    (FUTURE) nor a node slurmctld has not heard from since it started (UNKNOWN)."""
    return observation is not None and observation.state.upper() not in ("FUTURE", "UNKNOWN")


def registration_refused(observation: SlurmNodeObserved | None) -> bool:
    """slurmctld refused the node's last slurmd registration (INVALID_REG, module
    docstring): in contact, but not a node Slurm will run jobs on or let anyone undrain
    until a registration that matches its `NodeName=` line."""
    return observation is not None and INVALID_REG in observation.flags
