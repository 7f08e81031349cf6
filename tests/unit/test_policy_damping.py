"""Property tests of damped starvation (policy/fairness.py, the hysteresis).

Random worlds under `prefer: Slurm` with a Slurm backlog that reports its head job and a
stream of pods, plus the adversaries of test_domain_properties (admins drain and cordon,
kubelets go NotReady, Slurm reports NOT_RESPONDING/DOWN, sources go stale, operators
pin, actions fail or stay queued). Every round is checked against the safety rules, and
against the hysteresis read from the log itself (not from the fold): within
`STARVATION_HOLD_SECONDS` of a starvation ending, Slurm's demand never takes a node from
Kubernetes (running pods or idle) unless Slurm holds less than its next job needs or
Kubernetes holds more than its fair share.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain import wellknown as wk
from sunkd.domain.events import K8sDemandObserved, Payload, SlurmDemandObserved
from sunkd.domain.ownership import running_pods
from sunkd.domain.policy import (
    KUBERNETES_WAIT_BOUND_SECONDS,
    STARVATION_HOLD_SECONDS,
    StartTransition,
    membership,
)
from sunkd.domain.policy.fairness import fair_share
from sunkd.domain.state import ClusterState
from tests.unit.domain_world import PARTITION, POOL, Log, Simulation, World, pool_spec
from tests.unit.test_domain_properties import _check_in_flight, _check_round, _perturb


@dataclass
class BacklogWorld(World):
    """The domain world, with a Slurm queue that reports a one-node head job."""

    def demand(self) -> list[Payload]:
        slurm, k8s = super().demand()
        assert isinstance(slurm, SlurmDemandObserved)
        head = 1 if self.pending_jobs else 0
        return [SlurmDemandObserved(partition=PARTITION, pending_jobs=slurm.pending_jobs,
                                    pending_nodes=slurm.pending_nodes, head_nodes=head,
                                    head_job=head), k8s]


def _last_starvation_end(log: Log, now: float) -> float | None:
    """When the last run of pending pods that lasted past the bound ended, from the log."""
    since: float | None = None
    ended: float | None = None
    for event in log.events:
        payload = event.payload
        at = event.recorded_at.timestamp()
        if at > now or not isinstance(payload, K8sDemandObserved):
            continue
        if payload.pending and since is None:
            since = at
        elif not payload.pending and since is not None:
            if at - since >= KUBERNETES_WAIT_BOUND_SECONDS:
                ended = at
            since = None
    return ended


def holdings(state: ClusterState) -> tuple[int, int, int]:
    """(members, Kubernetes' nodes, Slurm's nodes), moves counted for the side they go to."""
    members = [state.nodes[n] for n, p in membership(state, [pool_spec()]).items() if p == POOL]
    k8s = slurm = 0
    for node in members:
        owner = node.transition.to_owner if node.transition else node.owner
        k8s += owner == wk.OWNER_KUBERNETES
        slurm += owner == wk.OWNER_SLURM
    return len(members), k8s, slurm


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(3, 6),
       dwell=st.sampled_from([0.0, 60.0]), grace=st.sampled_from([0.0, 60.0]))
def test_a_starvation_that_ended_keeps_slurm_s_demand_off_kubernetes_nodes(
    seed: int, size: int, dwell: float, grace: float
) -> None:
    rng = random.Random(seed)
    spec = pool_spec(prefer="Slurm", dwell_seconds=dwell, reclaim_grace_seconds=grace,
                     max_in_flight=2)
    sim = Simulation(BacklogWorld.of(size), [spec])

    for step in range(250):
        world = sim.world
        world.pending_jobs = max(world.pending_jobs, size)  # the backlog never empties
        if rng.random() < 0.3:  # pods arrive in bursts
            for _ in range(rng.randint(1, 3)):
                world.pod_counter += 1
                world.pending_pods.append(f"pod-{world.pod_counter}")
        if step > 3 and rng.random() < 0.3:
            _perturb(sim, rng)  # the adversaries
        before = len(sim.rounds)
        decisions = sim.step(rng, chaos=step > 3, dt=rng.choice([5.0, 20.0, 40.0, 300.0]))
        state, now, _ = sim.rounds[before]
        _check_round(state, now, decisions, spec)
        _check_in_flight(sim.state, decisions, spec)
        ended = _last_starvation_end(sim.log, now)
        if ended is None or now - ended >= STARVATION_HOLD_SECONDS:
            continue
        members, k8s, slurm = holdings(state)
        short = slurm < (1 if state.slurm_demand.get(PARTITION) and
                         state.slurm_demand[PARTITION].pending_nodes else 0)
        for decision in decisions:
            if (isinstance(decision, StartTransition) and decision.to_owner == wk.OWNER_SLURM
                    and decision.reason.startswith("Slurm needs")):
                pods = running_pods(state.nodes[decision.node])
                assert short or k8s > fair_share(members), (
                    f"{now}: reclaimed {decision.node} ({len(pods)} pods) "
                    f"{now - ended:.0f} s into the hold")
