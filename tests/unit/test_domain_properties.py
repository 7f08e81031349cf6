"""Property tests: random worlds driven by the policy's own decisions.

Hypothesis picks a seed and the pool knobs; the seed drives a chaotic phase (jobs and
pods come and go, sources flap stale/fresh, admins drain and cordon, kubelets go
NotReady, Slurm reports NOT_RESPONDING/DOWN, operators pin, actions fail or stay
queued), then a cooperative phase (everything healthy, no new demand). Every round of
`decide` is checked against the safety rules on the very state it saw, and the world
is checked for the one outcome that must never happen: a Slurm job and a pool pod
running on the same node. At the end every transition must have ended, and the log
must replay to the same state and the same decisions.
"""

from __future__ import annotations

import json
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sunkd.domain.events import OperatorPinned
from sunkd.domain.fold import fold
from sunkd.domain.ownership import assess, has_hold_taint, is_ours, slurm_drained
from sunkd.domain.policy import (
    CompleteTransition,
    Decision,
    PoolSpec,
    RequestAction,
    StartTransition,
    decide,
)
from sunkd.domain.snapshot import state_from_json, state_to_json
from sunkd.domain.state import ClusterState
from tests.unit.domain_world import POOL, Simulation, World, pool_spec


def _check_round(
    state: ClusterState, now: float, decisions: list[Decision], spec: PoolSpec
) -> None:
    knobs = spec.ownership
    requested_sides: Counter[tuple[str, str]] = Counter()
    for decision in decisions:
        node = state.nodes[decision.node]
        assessment = assess(state, node, now)
        # Never act while a source is stale or the node is not observed on both sides.
        assert assessment.actionable, (decision, assessment.unknown_reasons)
        assert state.source_fresh("slurm") and state.source_fresh("kubernetes")
        assert decision.reason, decision
        handing_over = (
            isinstance(decision, RequestAction) and decision.verb == "unlock"
        ) or (isinstance(decision, CompleteTransition) and decision.to_owner == "kubernetes")
        if handing_over:
            # Never hand a node to Kubernetes unless Slurm reports it drained (by us).
            assert slurm_drained(node.slurm), (decision, node.slurm)
            assert node.slurm is not None and is_ours(node.slurm.reason)
        if isinstance(decision, RequestAction):
            assert node.open_action_on(decision.side) is None, decision
            requested_sides[(decision.node, decision.side)] += 1
            if decision.verb == "resume":
                assert node.slurm is not None and "DRAIN" in node.slurm.flags
                assert is_ours(node.slurm.reason), (decision, node.slurm.reason)
                assert decision.arg("expect_reason") == node.slurm.reason
            if decision.verb == "uncordon":
                assert has_hold_taint(node.k8s), decision  # only ever sunkd's own taint
            if decision.verb == "drain":
                assert is_ours(decision.arg("reason"))
                slurm = node.slurm
                assert slurm is None or "DRAIN" not in slurm.flags or is_ours(slurm.reason)
        if isinstance(decision, StartTransition) and decision.from_owner != "none":
            voluntary = node.pin is None and knobs.mode == "Auto"
            if voluntary and node.last_move_at is not None:
                assert now - node.last_move_at >= knobs.dwell_seconds, (decision, node)
    assert all(count == 1 for count in requested_sides.values()), requested_sides


def _check_in_flight(after: ClusterState, decisions: list[Decision], spec: PoolSpec) -> None:
    if not any(isinstance(d, StartTransition) and d.from_owner != "none" for d in decisions):
        return
    moving = sum(
        1
        for node in after.nodes.values()
        if node.transition is not None
        and node.transition.is_move
        and node.transition.pool == POOL
    )
    assert moving <= spec.ownership.max_in_flight, moving


def _check_world(world: World) -> None:
    for node in world.nodes.values():
        both = node.job_ends_at is not None and node.pods
        assert not both, f"{node.name}: a Slurm job and pool pods at once: {node}"


def _perturb(sim: Simulation, rng: random.Random) -> None:
    world = sim.world
    for side, fresh in world.fresh.items():
        if not fresh and rng.random() < 0.3:
            world.fresh[side] = True  # outages end
    nodes = sorted(world.nodes)
    node = world.nodes[rng.choice(nodes)]
    roll = rng.random()
    if roll < 0.25:
        world.pending_jobs = rng.randint(0, len(nodes))
    elif roll < 0.55:
        if rng.random() < 0.6:
            world.pod_counter += 1
            world.pending_pods.append(f"pod-{world.pod_counter}")
        elif world.pending_pods:
            world.pending_pods.pop()
    elif roll < 0.58:
        side = rng.choice(["slurm", "kubernetes"])
        world.fresh[side] = False
    elif roll < 0.62:
        if "DRAIN" not in node.flags:
            node.flags.add("DRAIN")
            node.reason = "admin: maintenance"
        elif node.reason == "admin: maintenance":
            node.flags.discard("DRAIN")
            node.reason = None
    elif roll < 0.66:
        node.ready = not node.ready
    elif roll < 0.70:
        if "NOT_RESPONDING" in node.flags:
            node.flags.discard("NOT_RESPONDING")
        else:
            node.flags.add("NOT_RESPONDING")
    elif roll < 0.72:
        if node.slurm_state == "DOWN":
            node.slurm_state = "IDLE"
        else:
            node.slurm_state = "DOWN"
            node.job_ends_at = None  # a node going down kills its jobs
    elif roll < 0.76:
        node.unschedulable = not node.unschedulable  # an operator's cordon / uncordon
    elif roll < 0.80:
        to = rng.choice(["slurm", "kubernetes", "auto", "auto"])
        sim.log.add(OperatorPinned(node=node.name, to=to, who="op", why="chaos"), sim.now)


def _calm(world: World) -> None:
    world.fresh = {"slurm": True, "kubernetes": True}
    world.pending_jobs = 0
    world.pending_pods = []
    for node in world.nodes.values():
        node.ready = True
        node.flags.discard("NOT_RESPONDING")
        if node.slurm_state == "DOWN":
            node.slurm_state = "IDLE"
        if node.reason == "admin: maintenance":
            node.flags.discard("DRAIN")
            node.reason = None
        node.unschedulable = False


knob_strategy = st.fixed_dictionaries(
    {
        "dwell_seconds": st.sampled_from([0.0, 60.0, 300.0]),
        "max_in_flight": st.integers(1, 3),
        "drain_timeout_seconds": st.sampled_from([60.0, 300.0, 900.0]),
        "reclaim_grace_seconds": st.sampled_from([0.0, 60.0, 200.0]),
        "prefer": st.sampled_from(["Slurm", "Kubernetes"]),
        "min_kubernetes": st.integers(0, 1),
        "min_slurm": st.integers(0, 1),
        "mode": st.sampled_from(["Auto", "Auto", "Auto", "Slurm", "Kubernetes"]),
    }
)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), knobs=knob_strategy, size=st.integers(2, 5))
def test_random_worlds_keep_the_safety_invariants_and_settle(
    seed: int, knobs: dict[str, object], size: int
) -> None:
    rng = random.Random(seed)
    spec = pool_spec(**knobs)
    sim = Simulation(World.of(size), [spec])
    for _ in range(3):  # warm-up: sources report, nodes get adopted
        sim.step(rng)
    for _ in range(150):
        for _ in range(rng.randint(0, 2)):
            _perturb(sim, rng)
        before = len(sim.rounds)
        decisions = sim.step(rng, chaos=True, dt=rng.choice([1.0, 5.0, 15.0, 40.0]))
        state, now, _ = sim.rounds[before]
        _check_round(state, now, decisions, spec)
        _check_in_flight(sim.state, decisions, spec)
        _check_world(sim.world)

    _calm(sim.world)
    for node in sorted(sim.world.nodes):
        sim.log.add(OperatorPinned(node=node, to="auto", who="op", why="calm"), sim.now)
    for _ in range(400):
        before = len(sim.rounds)
        decisions = sim.step(rng, chaos=False, dt=30.0)
        state, now, _ = sim.rounds[before]
        _check_round(state, now, decisions, spec)
        _check_in_flight(sim.state, decisions, spec)
        _check_world(sim.world)
        settled = all(n.transition is None for n in sim.state.nodes.values())
        if settled and not sim.state.pending_actions() and not decisions:
            break
    open_transitions = {
        n.name: n.transition for n in sim.state.nodes.values() if n.transition is not None
    }
    assert open_transitions == {}
    assert sim.state.pending_actions() == []

    # Replay determinism: the log folds to the same state, from scratch or from a
    # snapshot plus the tail, and each recorded round's decisions are reproduced.
    events = sim.log.events
    assert fold(events) == sim.state
    cut = rng.randint(0, len(events))
    snapshot = state_from_json(json.loads(json.dumps(state_to_json(fold(events[:cut])))))
    assert fold(events[cut:], snapshot) == sim.state
    for state, now, decisions in sim.rounds[:: max(len(sim.rounds) // 10, 1)]:
        replayed = fold(events[: state.last_seq])
        assert replayed == state
        assert decide(replayed, [spec], now) == decisions
