"""A slurmd pod whose registration Slurm refuses (INVALID_REG): held, never undrained,
never recreated in a loop, and said (docs/nodeset.md, "Registration checks").

slurmctld validates every registration against the node's `NodeName=` line
(`validate_node_specs` in src/slurmctld/node_mgr.c): fewer CPUs, less memory or other GRES
than configured (without `SlurmdParameters=config_overrides`) set NODE_STATE_INVALID_REG
and drain the node with Slurm's reason (`Low RealMemory (reported:24105 < 100.00% of
configured:99999999)`), unless it is already DOWN, DRAIN or FAIL. Then 22.05 keeps the
reason that was there (sunkd's repair or lend drain), 24.11 and later replace it with
Slurm's. Either way slurmctld refuses UNDRAIN and RESUME while the flag is on
(`_valid_node_state_change`), and a new pod would register the same way: the node is
held, a Warning Event on the Node carries Slurm's state and reason, and nothing is
deleted, created or undrained until the next registration clears the flag. (Measured on
22.05.8, 24.11.5 and 26.05.5: tests/integration/test_slurmd_invalid_reg_real.py.)
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sunkd.domain.events import ActionFailed, K8sWorkloadObserved
from sunkd.domain.ownership import assess
from sunkd.domain.policy import VERB_DRAIN, VERB_RESUME, Decision, StartTransition
from sunkd.domain.policy.model import VERB_WARN
from sunkd.domain.policy.slurmd import (
    VERB_SLURMD_CREATE,
    VERB_SLURMD_DELETE,
    counts,
    nodes_from_state,
    nodeset_of,
)
from sunkd.domain.ports import RefusedError
from sunkd.domain.state import Phase
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.model import SlurmNode
from tests.unit.domain_world import POOL, Log, k8s_obs, slurm_obs
from tests.unit.test_slurmd_ownership import lent, own, requests, succeed, world
from tests.unit.test_slurmd_repair import brought_up, repair_drain, step, verbs

LOW_MEMORY = "Low RealMemory (reported:24105 < 100.00% of configured:99999999)"
POD_VERBS = {VERB_SLURMD_CREATE, VERB_SLURMD_DELETE}


def warnings(decisions: list[Decision]) -> list[dict[str, str]]:
    return [{label.key: label.value for label in action.args}
            for action in requests(decisions) if action.verb == VERB_WARN]


def rounds(log: Log, times: tuple[float, ...]) -> list[Decision]:
    """Several rounds; every action succeeds (a warn is written, and so on)."""
    seen: list[Decision] = []
    for now in times:
        decisions = step(log, now)
        succeed(log, decisions, now + 0.1)
        seen += decisions
    return seen


def recreated_under_repair_drain() -> tuple[Log, str, float]:
    """n1's pod deleted by someone; sunkd drained, recreated it; the new pod runs."""
    log = brought_up()
    log.add(K8sWorkloadObserved(node="n1", pods=()), 110.0)
    reason = repair_drain(log, 110.5)
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), 111.0)
    create = step(log, 111.5)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 111.6)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=112.0),)), 112.0)
    return log, reason, 113.0


def test_invalid_under_sunkds_repair_drain_is_held_never_undrained_nor_recreated() -> None:
    """22.05 keeps sunkd's reason: today the repair sees its slurmd registered (in
    contact) and asks for the UNDRAIN slurmctld refuses, again and again."""
    log, reason, now = recreated_under_repair_drain()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=reason), now)
    state = log.state()
    assert assess(state, state.nodes["n1"], now + 1).phase == Phase.HELD
    seen = rounds(log, (now + 1, now + 40, now + 200, now + 700, now + 2000))
    assert VERB_RESUME not in verbs(seen), seen
    assert not POD_VERBS & set(verbs(seen)), seen
    said = warnings(seen)
    assert said and said[0]["event_reason"] == "SunkdInvalidRegistration", seen
    assert "INVALID_REG" in said[0]["message"] and reason in said[0]["message"]


def test_invalid_with_slurms_own_drain_is_held_and_says_slurms_reason() -> None:
    """A first registration with too little memory (24.11 and later also put this
    reason over sunkd's drain): held, Slurm's reason in a Warning, the pod kept."""
    log = brought_up()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=LOW_MEMORY), 10.0)
    state = log.state()
    assert assess(state, state.nodes["n1"], 10.5).phase == Phase.HELD
    seen = rounds(log, (11.0, 60.0, 200.0, 700.0, 2000.0))
    assert not POD_VERBS & set(verbs(seen)) and VERB_RESUME not in verbs(seen), seen
    said = warnings(seen)
    assert said and said[0]["event_reason"] == "SunkdInvalidRegistration", seen
    assert LOW_MEMORY in said[0]["message"]


def test_a_reclaimed_pod_registering_invalid_is_not_returned_to_service() -> None:
    """22.05 leaves a lent node DOWN+DRAIN under sunkd's lend drain and adds INVALID_REG:
    today the reclaim asks for the RESUME slurmctld refuses."""
    log = world()
    reason = lent(log)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "NOT_RESPONDING"), reason=reason),
            100.0)
    log.add(k8s_obs("n1", pin="slurm", tainted=False), 200.0)
    succeed(log, step(log, 200.0), 200.1)
    log.add(k8s_obs("n1", pin="slurm"), 200.2)
    create = step(log, 201.0)
    assert verbs(create) == [VERB_SLURMD_CREATE], create
    succeed(log, create, 201.1)
    log.add(K8sWorkloadObserved(node="n1", pods=(own(started_at=202.0),)), 202.0)
    log.add(slurm_obs("n1", state="DOWN", flags=("DRAIN", "INVALID_REG"), reason=reason),
            203.0)
    seen = rounds(log, (204.0, 250.0, 500.0))
    assert VERB_RESUME not in verbs(seen), seen
    assert VERB_SLURMD_DELETE not in verbs(seen), seen


def test_an_invalid_registration_is_not_counted_registered() -> None:
    log = brought_up()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=LOW_MEMORY), 10.0)
    state = log.state()
    observed = state.nodesets[POOL]
    nodeset = nodeset_of(observed)
    assert nodeset is not None
    views = nodes_from_state(state, nodeset, [state.nodes["n1"]], 11.0)
    assert counts(nodeset, views)["registered"] == 0


def test_the_flag_gone_under_sunkds_drain_the_repair_undrains() -> None:
    """Someone fixed slurm.conf (or the host) and slurmd registered again: 22.05 shows
    sunkd's drain without INVALID_REG, which sunkd lifts as after any repair."""
    log, reason, now = recreated_under_repair_drain()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=reason), now)
    rounds(log, (now + 1, now + 40))
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=reason), now + 50)
    seen = rounds(log, (now + 51, now + 52))
    assert VERB_RESUME in verbs(seen), seen
    assert not POD_VERBS & set(verbs(seen)), seen


def test_never_lent_while_invalid() -> None:
    log = brought_up()
    log.add(slurm_obs("n1", flags=("INVALID_REG",)), 10.0)  # a DOWN or FAIL kept the drain off
    log.add(k8s_obs("n1", pin="kubernetes"), 10.0)
    for decision in rounds(log, (10.5, 11.0, 50.0)):
        assert not isinstance(decision, StartTransition), decision


# ------------------------------------------------------------------- against adversaries

REASONS = (None, LOW_MEMORY, "bad DIMM", "Not responding", "sunkd: copied by hand")
PODS = (("running",) * 3) + ("failed", "gone", "terminating")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_invalid_registration_is_never_undrained_lent_drained_or_its_pod_deleted(
    data: st.DataObject,
) -> None:
    """Rounds of the daemon over a Slurm-owned node with its pod, the INVALID_REG flag
    coming and going, with any reason (sunkd's repair drain, Slurm's, an administrator's,
    a copy of sunkd's words), DRAIN or DOWN or neither, a job allocated or not, the pod
    running, failed, terminating or gone, a pin to Kubernetes, and actions that succeed
    or fail. While Slurm reports INVALID_REG: never a resume nor a lend; with the pod
    running, never a drain nor its delete; never counted registered; a Warning while it lasts is the
    invalid registration's and carries Slurm's state and reason."""
    log, drained_with, now = recreated_under_repair_drain()
    for _ in range(data.draw(st.integers(1, 8))):
        invalid = data.draw(st.booleans())
        reason = data.draw(st.sampled_from((drained_with, drained_with, *REASONS)))
        flags = {"INVALID_REG"} if invalid else set()
        if data.draw(st.integers(0, 3)):
            flags.add("DRAIN")
        if data.draw(st.integers(0, 4)) == 0:
            flags.add("NOT_RESPONDING")
        busy = data.draw(st.integers(0, 4)) == 0
        log.add(slurm_obs("n1", state=data.draw(st.sampled_from(
            ("IDLE", "IDLE", "DOWN", "MIXED" if busy else "IDLE"))),
            flags=tuple(sorted(flags)), reason=reason, alloc_cpus=4 if busy else 0), now)
        pod = data.draw(st.sampled_from(PODS))
        pods = {"running": (own(started_at=112.0),), "failed": (own("Failed"),),
                "terminating": (own(deleting=True),), "gone": ()}[pod]
        log.add(K8sWorkloadObserved(node="n1", pods=pods), now)
        if data.draw(st.integers(0, 5)) == 0:
            log.add(k8s_obs("n1", pin=data.draw(st.sampled_from((None, "kubernetes")))), now)
        now += data.draw(st.sampled_from((0.5, 1.0, 40.0, 130.0, 700.0)))
        state = log.state()
        node = state.nodes["n1"]
        slurm = node.slurm
        assert slurm is not None
        refused = "INVALID_REG" in slurm.flags
        observed = state.nodesets[POOL]
        nodeset = nodeset_of(observed)
        assert nodeset is not None
        if refused:
            views = nodes_from_state(state, nodeset, [node], now)
            assert counts(nodeset, views)["registered"] == 0
        decisions = step(log, now)
        event(f"refused={refused} verbs={sorted(verbs(decisions))}")
        for decision in decisions:
            if refused and isinstance(decision, StartTransition):
                assert decision.to_owner != "kubernetes", decision
        for action in requests(decisions):
            if not refused:
                continue
            assert action.verb != VERB_RESUME, action
            if action.verb in (VERB_DRAIN, VERB_SLURMD_DELETE):
                # Only the repair of a pod that ended or went (a drain first: harmless
                # over INVALID_REG); the running pod Slurm refused is left as it is.
                assert pod != "running", action
            if action.verb == VERB_WARN and not assess(state, node, now).conflicts:
                args = {label.key: label.value for label in action.args}
                if args["event_reason"] != "SunkdInvalidPin":
                    assert args["event_reason"] == "SunkdInvalidRegistration", args
                    assert "INVALID_REG" in args["message"]
                    assert slurm.reason is None or slurm.reason in args["message"]
        for action in requests(decisions):
            if data.draw(st.integers(0, 3)):
                succeed(log, [action], now + 0.1)
            else:
                log.add(ActionFailed(action_id=action.action_id,
                                     transition_id=action.transition_id, side=action.side,
                                     verb=action.verb, node=action.node,
                                     attempt=action.attempt, error="adversary",
                                     retryable=data.draw(st.booleans())), now + 0.1)
        now += 0.5


class _Client:
    """A slurmrestd that reports `node` and records updates."""

    can_update_nodes = True

    def __init__(self, node: SlurmNode) -> None:
        self.node = node
        self.updates: list[str] = []

    async def get_node(self, name: str) -> SlurmNode:
        return self.node

    async def update_node(self, name: str, *, state: str, reason: str | None) -> None:
        self.updates.append(state)
        if state == "UNDRAIN":
            self.node = self.node._replace(flags=self.node.flags - {"DRAIN"})


@pytest.mark.parametrize("down", [False, True])
async def test_the_actuator_refuses_an_undrain_over_invalid_reg(down: bool) -> None:
    """A decision read before the flag came: slurmctld would refuse it; the actuator says
    why without asking."""
    reason = "sunkd: slurmd pod repair (missing)"
    client = _Client(SlurmNode("n1", "DOWN" if down else "IDLE",
                               frozenset({"DRAIN", "INVALID_REG"}), reason=reason,
                               reason_time=100.0))
    actuator = SlurmActuator(client)  # type: ignore[arg-type]
    with pytest.raises(RefusedError, match="refused its slurmd registration"):
        await actuator.resume("n1", expect_reason=reason, expect_reason_time=100.0,
                              return_to_service=down)
    assert client.updates == []
    client.node = client.node._replace(state="IDLE", flags=frozenset({"DRAIN"}))
    assert await actuator.resume("n1", expect_reason=reason, expect_reason_time=100.0)
    assert client.updates == ["UNDRAIN"]  # the flag gone: the undrain goes out


def test_the_metric_counts_the_held_node() -> None:
    from prometheus_client import generate_latest

    from sunkd.api.metrics import Metrics
    from sunkd.domain.policy import effective_pools

    log = brought_up()
    log.add(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"), reason=LOW_MEMORY), 10.0)
    state = log.state()
    metrics = Metrics()
    metrics.set_state(state, 11.0, effective_pools(state))
    text = generate_latest(metrics.registry).decode()
    assert f'sunkd_nodes_invalid_registration{{pool="{POOL}"}} 1.0' in text
    log.add(slurm_obs("n1", flags=("DRAIN",), reason=LOW_MEMORY), 12.0)
    metrics.set_state(log.state(), 13.0, effective_pools(log.state()))
    text = generate_latest(metrics.registry).decode()
    assert f'sunkd_nodes_invalid_registration{{pool="{POOL}"}} 0.0' in text


def test_a_refused_registration_is_not_drained_for_kubernetes() -> None:
    """The lend's one predicate (the policy's and the executor's re-check): a node whose
    registration slurmctld refused is not handed over, whatever a stale view said."""
    from sunkd.domain.slurmnode import slurm_drained

    assert slurm_drained(slurm_obs("n1", flags=("DRAIN",), reason=LOW_MEMORY))
    assert not slurm_drained(slurm_obs("n1", flags=("DRAIN", "INVALID_REG"),
                                       reason=LOW_MEMORY))
