"""Safety scenarios 1 and 8 against a real Slurm (docs/safety.md): an administrator's
DOWN is never overwritten, sunkd removes its drains with UNDRAIN (never RESUME, which
would return a DOWN node to service, but for the one DOWN sunkd's own slurmd pod left
under sunkd's drain, once the new slurmd registered), an undrain refuses when the reason
changed since the decision, and a `sunkd:` reason sunkd did not write is never lifted."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from sunkd.domain.events import SourceHealth, TransitionCompleted, TransitionStarted
from sunkd.domain.ownership import assess
from sunkd.domain.policy import RequestAction, decide
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.client import SlurmRestClient
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import jwt_client, start_cluster, wait_node
from tests.unit.domain_world import PARTITION, POOL, Log, k8s_obs, pool_spec
from tests.unit.test_domain_policy import _record, _succeed

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from start_cluster("ss[1-4]", slurmd_timeout=5)


@pytest.fixture
async def client(cluster: SlurmCluster) -> AsyncIterator[SlurmRestClient]:
    async with jwt_client(cluster) as c:
        yield c


@pytest.fixture
def actuator(cluster: SlurmCluster, client: SlurmRestClient) -> SlurmActuator:
    return SlurmActuator(client, scontrol_env=cluster.env)


async def test_s1_an_admin_down_is_never_overwritten(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    cluster.scontrol("update", "nodename=ss1", "state=down", "reason=bad DIMM")
    try:
        node = await wait_node(client, "ss1", lambda n: n.state == "DOWN")
        assert not node.is_drain  # DOWN carries no DRAIN flag ...
        with pytest.raises(RefusedError, match="bad DIMM"):
            await actuator.drain("ss1", "k8s NotReady")  # ... and is still not ours
        node = await wait_node(client, "ss1", lambda n: True)
        assert node.state == "DOWN" and node.reason == "bad DIMM"
    finally:
        cluster.scontrol("update", "nodename=ss1", "state=resume")
    await wait_node(client, "ss1", lambda n: n.state == "IDLE" and not n.flags)


async def test_s1_undrain_keeps_slurms_down(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    """Our drain on a node that then went DOWN (our reason kept): removing our drain must
    not return the node to service. RESUME would (ss2 back to IDLE); UNDRAIN does not."""
    assert await actuator.drain("ss2", "lent to kubernetes [tx s1]") is True
    ours = "sunkd: lent to kubernetes [tx s1]"
    cluster.scontrol("update", "nodename=ss2", "state=down", f"reason={ours}")
    try:
        await wait_node(client, "ss2", lambda n: n.state == "DOWN" and n.is_drain)
        assert await actuator.resume("ss2", expect_reason=ours) is True
        node = await wait_node(client, "ss2", lambda n: not n.is_drain)
        assert node.state == "DOWN", f"UNDRAIN must leave DOWN alone, got {node.display_state}"
    finally:
        cluster.scontrol("update", "nodename=ss2", "state=resume")
    await wait_node(client, "ss2", lambda n: n.state == "IDLE" and not n.flags)


async def test_s8_undrain_refuses_when_the_reason_changed_since_the_decision(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    assert await actuator.drain("ss3", "lent to kubernetes [tx s8]") is True
    decided_on = "sunkd: lent to kubernetes [tx s8]"
    # An admin re-drains with a reason in our format (editing ours): still not what the
    # policy decided to remove.
    cluster.scontrol("update", "nodename=ss3", "state=drain", "reason=sunkd: keep, ticket 42")
    try:
        await wait_node(client, "ss3", lambda n: n.reason == "sunkd: keep, ticket 42")
        with pytest.raises(RefusedError, match="changed since the decision"):
            await actuator.resume("ss3", expect_reason=decided_on)
        node = await wait_node(client, "ss3", lambda n: True)
        assert node.is_drain and node.reason == "sunkd: keep, ticket 42"
    finally:
        cluster.scontrol("update", "nodename=ss3", "state=resume")
    await wait_node(client, "ss3", lambda n: n.state == "IDLE" and not n.flags)


async def test_s8_writes_check_leadership_right_before_they_go_out(
    cluster: SlurmCluster, client: SlurmRestClient
) -> None:
    leading = False
    actuator = SlurmActuator(client, scontrol_env=cluster.env, may_write=lambda: leading)
    with pytest.raises(ActionError, match=r"not .*leader"):
        await actuator.drain("ss4", "lend")
    node = await wait_node(client, "ss4", lambda n: True)
    assert not node.is_drain  # nothing was written


async def _round(log: Log, client: SlurmRestClient, now: float) -> list[RequestAction]:
    """Observe ss4 in real Slurm (as the Slurm source would), then one policy round."""
    node = await client.get_node("ss4")
    log.add(dataclasses.replace(node.to_observed(), partitions=(PARTITION,)), now)
    decisions = decide(log.state(), [pool_spec()], now)
    return [d for d in decisions if isinstance(d, RequestAction)]


async def _run(log: Log, actuator: SlurmActuator, action: RequestAction, now: float) -> None:
    """Record and execute one request as the outbox would, and log its success."""
    _record(log, [action], now)
    if action.verb == "drain":
        await actuator.drain("ss4", action.arg("reason") or "")
    else:
        when = action.arg("expect_reason_time")
        await actuator.resume("ss4", expect_reason=action.arg("expect_reason"),
                              expect_reason_time=float(when) if when else None)
    _succeed(log, action, now)


async def test_i2_a_sunkd_reason_written_by_hand_is_never_lifted(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    """Proof of authorship from the log, against real Slurm and its reason times: sunkd
    undrains its own mirror drain; an admin's drain with a reason in sunkd's format, or
    sunkd's drain re-drained by an admin with the very same text, stays."""
    mirror = "sunkd: k8s NotReady"
    log = Log()
    log.add(SourceHealth(source="slurm", status="fresh"), 0.0, subject="slurm")
    log.add(SourceHealth(source="kubernetes", status="fresh"), 0.0, subject="kubernetes")
    log.add(k8s_obs("ss4"), 1.0)
    log.add(TransitionStarted(transition_id="adopt", node="ss4", pool=POOL,
                              from_owner="none", to_owner="slurm"), 2.0)
    log.add(TransitionCompleted(transition_id="adopt", node="ss4"), 2.0)
    try:
        # 1. An admin writes sunkd's mirror reason by hand: held, never undrained.
        cluster.scontrol("update", "nodename=ss4", "state=drain", f"reason={mirror}")
        await wait_node(client, "ss4", lambda n: n.is_drain and n.reason == mirror)
        # Held: mirrored as sunkd's hold taint in Kubernetes, never undrained.
        assert [a.verb for a in await _round(log, client, 10.0)] == ["cordon"]
        state = log.state()
        assert assess(state, state.nodes["ss4"], 10.0).slurm_holds
        cluster.scontrol("update", "nodename=ss4", "state=undrain")
        await wait_node(client, "ss4", lambda n: not n.flags)  # NOT_RESPONDING for ~1 s

        # 2. sunkd's own mirror drain (the kubelet NotReady) is undrained once it is Ready.
        log.add(k8s_obs("ss4", ready=False), 20.0)
        (drain,) = await _round(log, client, 21.0)
        assert (drain.verb, drain.arg("reason")) == ("drain", mirror)
        await _run(log, actuator, drain, 22.0)
        log.add(k8s_obs("ss4"), 23.0)
        (resume,) = await _round(log, client, 24.0)
        assert resume.verb == "resume" and resume.arg("expect_reason_time")
        await _run(log, actuator, resume, 25.0)
        await wait_node(client, "ss4", lambda n: not n.flags)

        # 3. sunkd drains again; an admin undrains and drains again with the very same
        # text between two of sunkd's looks. (Draining a drained node with its own reason
        # changes nothing in Slurm, not even the reason time: 22.05.8, measured here.)
        log.add(k8s_obs("ss4", ready=False), 30.0)
        (drain,) = await _round(log, client, 31.0)
        await _run(log, actuator, drain, 32.0)
        first = await client.get_node("ss4")
        assert first.reason == mirror and first.reason_time is not None
        log.add(dataclasses.replace(first.to_observed(), partitions=(PARTITION,)), 33.0)
        await asyncio.sleep(1.1)
        cluster.scontrol("update", "nodename=ss4", "state=drain", f"reason={mirror}")
        same = await client.get_node("ss4")
        assert same.reason_time == first.reason_time
        await asyncio.sleep(1.1)
        cluster.scontrol("update", "nodename=ss4", "state=undrain")
        cluster.scontrol("update", "nodename=ss4", "state=drain", f"reason={mirror}")
        again = await wait_node(
            client, "ss4", lambda n: n.reason_time is not None
            and n.reason_time > (first.reason_time or 0) + 1)
        assert again.is_drain and again.reason == mirror
        log.add(k8s_obs("ss4"), 34.0)
        assert "resume" not in [a.verb for a in await _round(log, client, 35.0)]
        node = await client.get_node("ss4")
        assert node.is_drain and node.reason == mirror
    finally:
        cluster.scontrol("update", "nodename=ss4", "state=resume", check=False)
    await wait_node(client, "ss4", lambda n: n.state == "IDLE" and not n.flags)


async def test_a_node_down_only_because_sunkds_slurmd_was_away_returns_to_service(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    """With slurmd in sunkd's pod, a lent node's slurmd is gone for good: Slurm makes the
    drained node DOWN, keeping sunkd's reason. When the reclaim's new slurmd registers,
    ReturnToService=1 does not bring it back (only a DOWN whose reason is "Not
    responding"), and UNDRAIN would leave it DOWN: on the policy's word that its slurmd
    registered, the resume returns exactly that DOWN to service, and still refuses a DOWN
    someone set since (a new reason time) or a node Slurm does not hear."""
    ours = "sunkd: lent to kubernetes [tx rts]"
    assert await actuator.drain("ss3", "lent to kubernetes [tx rts]") is True
    drained = await wait_node(client, "ss3", lambda n: n.is_drain)
    cluster.kill_slurmd("ss3", sig=signal.SIGTERM)
    try:
        down = await wait_node(client, "ss3", lambda n: n.state == "DOWN", within=60)
        assert down.reason == ours and down.reason_time == drained.reason_time
        with pytest.raises(RefusedError, match="not hear"):  # its slurmd is away
            await actuator.resume("ss3", expect_reason=ours,
                                  expect_reason_time=drained.reason_time,
                                  return_to_service=True)
        cluster.start_slurmd("ss3", wait=False)
        registered = await wait_node(client, "ss3", lambda n: "NOT_RESPONDING" not in n.flags,
                                     within=60)
        assert registered.state == "DOWN" and registered.is_drain, registered.display_state
        assert await actuator.resume("ss3", expect_reason=ours,
                                     expect_reason_time=drained.reason_time,
                                     return_to_service=True) is True
        # Right after RESUME slurmctld may show it IDLE* until its next ping.
        await wait_node(client, "ss3", lambda n: n.state == "IDLE" and not n.flags, within=30)
        # The same, but someone set the node DOWN with sunkd's text since: refused.
        assert await actuator.drain("ss3", "lent to kubernetes [tx rts2]") is True
        first = await wait_node(client, "ss3", lambda n: n.is_drain)
        assert first.reason_time is not None
        # Slurm's reason times are whole seconds: the DOWN below lands in the very next
        # second when the machine keeps up (the closest a re-set can be told apart), later
        # when it does not.
        await asyncio.sleep(max(0.0, first.reason_time + 1.2 - time.time()))
        mine = "sunkd: lent to kubernetes [tx rts2]"
        cluster.scontrol("update", "nodename=ss3", "state=down", f"reason={mine}")
        await wait_node(client, "ss3", lambda n: n.state == "DOWN")
        with pytest.raises(RefusedError):
            await actuator.resume("ss3", expect_reason=mine,
                                  expect_reason_time=first.reason_time,
                                  return_to_service=True)
    finally:
        cluster.start_slurmd("ss3", wait=False)
        cluster.scontrol("update", "nodename=ss3", "state=resume", check=False)
    await wait_node(client, "ss3", lambda n: n.state == "IDLE" and not n.flags, within=60)
