"""Against a real private Slurm cluster: normalized node states, drain/resume, auth.

The module runs once per Slurm generation (`slurm_version`: 22.05 from the host's
packages, 24.11 and 26.05 from Debian roots; tests/integration/conftest.py), one cluster
each; every test uses its own nodes so they do not disturb each other (sc1 idle/foreign
drain, sc2 mixed, sc3 allocated and never drained, sc4 drain cycle, sc5 down, sc6 not
responding, sc7 resume flap and transports). Where the generations differ the expected
value comes from tests/integration/slurm_helpers.py (measured live, docs/slurm.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sunkd.domain.ownership import slurm_drained
from sunkd.domain.ports import ActionError, RefusedError
from sunkd.slurm.actuator import SlurmActuator
from sunkd.slurm.auth import mint_jwt
from sunkd.slurm.client import SlurmRestClient
from sunkd.slurm.model import SlurmAuthError
from sunkd_testbed.slurm import SlurmCluster
from tests.integration.slurm_helpers import (
    NEGOTIATED,
    SERVED,
    first_call,
    jwt_client,
    resumed_reason,
    start_cluster,
    wait_node,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(slurm_version: str) -> Iterator[SlurmCluster]:
    yield from start_cluster("sc[1-7]", slurmd_timeout=5, version=slurm_version)


@pytest.fixture
async def client(cluster: SlurmCluster) -> AsyncIterator[SlurmRestClient]:
    async with jwt_client(cluster) as c:
        yield c


@pytest.fixture
def actuator(cluster: SlurmCluster, client: SlurmRestClient) -> SlurmActuator:
    return SlurmActuator(client, scontrol_env=cluster.env)


async def test_negotiates_newest_served_version(
    cluster: SlurmCluster, client: SlurmRestClient, slurm_version: str
) -> None:
    assert client.version == cluster.rest_version == NEGOTIATED[slurm_version]
    assert client.slurm_release == cluster.slurm_version
    assert (client.slurm_release or "").startswith(f"{slurm_version}.")
    # Debian 12 (22.05) serves up to v0.0.38: no REST node updates; 24.11+ have them.
    assert client.can_update_nodes == (slurm_version != "22.05")
    # Every version it serves answers; the next one up is a 404 (what negotiation reads).
    for version in SERVED[slurm_version]:
        assert cluster.rest_get(f"/slurm/{version}/ping")[0] == 200, version
    newest = int(SERVED[slurm_version][-1].rsplit(".", 1)[1])
    assert cluster.rest_get(f"/slurm/v0.0.{newest + 1}/ping")[0] == 404


@pytest.mark.parametrize("transport", ["tcp-jwt", "unix-local"])
async def test_idle_node(cluster: SlurmCluster, transport: str) -> None:
    url = cluster.rest_url if transport == "tcp-jwt" else cluster.rest_unix_url
    key = cluster.jwt_key_path if transport == "tcp-jwt" else None
    async with SlurmRestClient(url, jwt_key_file=key) as c:
        assert c.auth_mode == ("jwt-key" if key else "local")
        nodes = {n.name: n for n in await c.get_nodes()}
    assert sorted(nodes) == list(cluster.node_names)
    node = nodes["sc1"]
    assert node.state == "IDLE"
    assert node.flags == frozenset()
    assert (node.cpus, node.alloc_cpus) == (2, 0)
    assert node.partitions == ("debug",)
    assert node.reason is None and node.reason_set_by is None
    assert node.boot_time is not None and node.boot_time > 1e9


async def test_mixed_and_allocated(cluster: SlurmCluster, client: SlurmRestClient) -> None:
    mixed = cluster.sbatch(nodelist="sc2", cpus=1)
    full = cluster.sbatch(nodelist="sc3", cpus=2)
    try:
        node = await wait_node(client, "sc2", lambda n: n.state == "MIXED" and n.alloc_cpus == 1)
        assert node.is_busy and not node.is_drain
        node = await wait_node(
            client, "sc3", lambda n: n.state == "ALLOCATED" and n.alloc_cpus == 2
        )
        assert node.display_state == "allocated"
        jobs = {j.job_id: j for j in await client.get_jobs()}
        assert jobs[mixed].state == "RUNNING"
        assert jobs[mixed].nodes == ("sc2",)
        assert jobs[full].node_count == 1
        assert jobs[full].partition == "debug"
        assert jobs[full].time_limit is None  # MaxTime=INFINITE
        assert jobs[full].start_time is not None
    finally:
        cluster.scancel(mixed, full)
    await wait_node(client, "sc2", lambda n: n.state == "IDLE", what="idle after cancel")


async def test_drain_busy_node_draining_then_drained_then_resume(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator, slurm_version: str
) -> None:
    job = cluster.sbatch(nodelist="sc4", cpus=2)
    await wait_node(client, "sc4", lambda n: n.state == "ALLOCATED")
    assert await actuator.drain("sc4", "lent to kubernetes [tx t1]") is True
    node = await wait_node(client, "sc4", lambda n: n.is_drain)
    assert node.display_state == "draining"
    assert node.is_busy and not node.is_drained
    assert node.reason == "sunkd: lent to kubernetes [tx t1]"
    assert node.reason_set_by == "root"
    assert node.reason_time is not None and abs(node.reason_time - time.time()) < 60
    # Idempotent: same reason again changes nothing.
    assert await actuator.drain("sc4", "sunkd: lent to kubernetes [tx t1]") is False
    cluster.scancel(job)
    node = await wait_node(client, "sc4", lambda n: n.is_drained, what="DRAINED")
    assert node.state == "IDLE" and node.display_state == "drained"
    assert cluster.node_states()["sc4"] == "drained"  # what sinfo says agrees

    assert await actuator.resume("sc4") is True
    node = await wait_node(client, "sc4", lambda n: not n.is_drain)
    # 24.11 keeps our old reason on the undrained node; 22.05 and 26.05 clear it.
    stale = resumed_reason(slurm_version, "sunkd: lent to kubernetes [tx t1]")
    assert node.reason == stale
    assert await actuator.resume("sc4") is False  # already resumed: a stale reason is no drain
    await wait_node(client, "sc4", lambda n: n.flags == frozenset() and n.state == "IDLE")
    # A stale `sunkd:` reason is not a drain of ours: nothing counts it as one.
    observed = (await client.get_node("sc4")).to_observed()
    assert "DRAIN" not in observed.flags and not slurm_drained(observed)
    assert observed.reason == stale
    # ... and draining again writes the new reason over it.
    assert await actuator.drain("sc4", "lent again [tx t2]") is True
    node = await wait_node(client, "sc4", lambda n: n.is_drained)
    assert node.reason == "sunkd: lent again [tx t2]"
    assert await actuator.resume("sc4") is True
    await wait_node(client, "sc4", lambda n: not n.is_drain and n.state == "IDLE")


async def test_drain_and_resume_over_each_transport(
    cluster: SlurmCluster, client: SlurmRestClient, slurm_version: str
) -> None:
    """REST where the version can update nodes (23.02+), and scontrol everywhere: the
    root's own scontrol through `cluster.scontrol_path` (22.05's cannot talk to 24.11+)."""
    transports = ["scontrol"] if slurm_version == "22.05" else ["rest", "scontrol"]
    for transport in transports:
        actuator = SlurmActuator(
            client,
            scontrol=cluster.scontrol_path,
            scontrol_env=cluster.env,
            prefer_rest=transport == "rest",
        )
        assert actuator.transport == transport
        reason = f"sunkd: over {transport}"
        assert await actuator.drain("sc7", reason) is True
        node = await wait_node(client, "sc7", lambda n: n.is_drained, what="drained")
        assert (node.reason, node.reason_set_by) == (reason, "root")
        assert "DRAIN" in cluster.node_flags("sc7")  # slurmctld's own view agrees
        assert await actuator.drain("sc7", reason) is False  # idempotent
        assert await actuator.resume("sc7") is True
        node = await wait_node(client, "sc7", lambda n: not n.is_drain, what="resumed")
        assert node.reason == resumed_reason(slurm_version, reason)
        assert await actuator.resume("sc7") is False
        await wait_node(client, "sc7", lambda n: n.state == "IDLE" and not n.flags, within=15)


async def test_foreign_drain_is_never_resumed_or_taken_over(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    cluster.scontrol("update", "nodename=sc1", "state=drain", "reason=admin: bad DIMM")
    try:
        node = await wait_node(client, "sc1", lambda n: n.is_drain)
        assert node.reason == "admin: bad DIMM"
        with pytest.raises(RefusedError, match="foreign drain"):
            await actuator.resume("sc1")
        with pytest.raises(RefusedError, match="already drained"):
            await actuator.drain("sc1", "lend")
        node = await wait_node(client, "sc1", lambda n: True)
        assert node.reason == "admin: bad DIMM" and node.is_drain  # untouched
    finally:
        cluster.scontrol("update", "nodename=sc1", "state=resume")
    await wait_node(client, "sc1", lambda n: not n.is_drain)


async def test_reason_prefix_is_enforced(
    cluster: SlurmCluster, client: SlurmRestClient, actuator: SlurmActuator
) -> None:
    assert await actuator.drain("sc7", "no prefix here") is True
    node = await wait_node(client, "sc7", lambda n: n.is_drain)
    assert node.reason == "sunkd: no prefix here"
    assert await actuator.resume("sc7") is True
    # Transient NOT_RESPONDING right after a resume (~1 s) is not a failure: the
    # resume reported success and the node settles as plain IDLE.
    await wait_node(client, "sc7", lambda n: n.state == "IDLE" and not n.flags, within=15)


async def test_unknown_node_is_a_permanent_error(actuator: SlurmActuator) -> None:
    with pytest.raises(ActionError) as info:
        await actuator.drain("nosuchnode", "x")
    assert not info.value.retryable
    assert "nosuchnode" in str(info.value)


async def test_down_node(cluster: SlurmCluster, client: SlurmRestClient) -> None:
    cluster.scontrol("update", "nodename=sc5", "state=down", "reason=admin: cable")
    try:
        node = await wait_node(client, "sc5", lambda n: n.state == "DOWN")
        assert node.reason == "admin: cable"
        assert not node.is_drain
    finally:
        cluster.scontrol("update", "nodename=sc5", "state=resume")
    await wait_node(client, "sc5", lambda n: n.state == "IDLE")


async def test_not_responding_then_down(cluster: SlurmCluster, client: SlurmRestClient) -> None:
    cluster.kill_slurmd("sc6")
    try:
        node = await wait_node(
            client, "sc6", lambda n: "NOT_RESPONDING" in n.flags, within=40, what="NOT_RESPONDING"
        )
        assert node.display_state.endswith("*")
        node = await wait_node(client, "sc6", lambda n: n.state == "DOWN", within=40, what="DOWN")
        assert "NOT_RESPONDING" in node.flags
        assert node.reason == "Not responding"
    finally:
        cluster.start_slurmd("sc6", wait=False)
    # ReturnToService=1: a node DOWN for "Not responding" comes back by itself.
    await wait_node(client, "sc6", lambda n: n.state == "IDLE" and not n.flags, within=40)


# ----------------------------------------------------------------------------- auth


# A refused token fails the first call that reaches slurmctld: on 22.05 that is the ping
# of `negotiate()`; 24.11+ answer the ping 200 (`pings[0].responding: false`, "Protocol
# authentication error") and refuse `GET /nodes` with 511. `first_call` does both.


async def test_token_signed_with_another_key(
    cluster: SlurmCluster
) -> None:
    client = SlurmRestClient(cluster.rest_url, token=mint_jwt(os.urandom(32), "root"))
    try:
        started = time.monotonic()
        with pytest.raises(SlurmAuthError, match="rejected"):
            await first_call(client)
        assert time.monotonic() - started < 4
    finally:
        await client.close()


async def test_expired_token(
    cluster: SlurmCluster
) -> None:
    key = cluster.jwt_key_path.read_bytes()
    token = mint_jwt(key, "root", 60, now=time.time() - 3600)
    client = SlurmRestClient(cluster.rest_url, token=token)
    try:
        with pytest.raises(SlurmAuthError, match="expired"):
            await first_call(client)
    finally:
        await client.close()


async def test_minted_token_for_another_user_reads(cluster: SlurmCluster) -> None:
    """HS256 tokens minted from the key are accepted for any user (reads need no rights)."""
    client = SlurmRestClient(cluster.rest_url, user="nobody", jwt_key_file=cluster.jwt_key_path)
    try:
        assert await client.negotiate() == cluster.rest_version
        assert len(await client.get_nodes()) == len(cluster.node_names)
    finally:
        await client.close()


async def test_no_token_over_tcp(
    cluster: SlurmCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUNKD_SLURM_TOKEN", raising=False)
    client = SlurmRestClient(cluster.rest_url)
    try:
        with pytest.raises(SlurmAuthError, match=r"401.*no JWT configured"):
            await client.negotiate()
    finally:
        await client.close()


async def test_token_file_is_reread_when_it_changes(cluster: SlurmCluster, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(mint_jwt(os.urandom(32), "root"))
    client = SlurmRestClient(cluster.rest_url, token_file=token_file)
    try:
        with pytest.raises(SlurmAuthError):
            await first_call(client)
        # `scontrol token` output format is accepted verbatim.
        token_file.write_text(f"SLURM_JWT={cluster.token('root', 600)}\n")
        os.utime(token_file, (time.time() + 5, time.time() + 5))
        assert await client.negotiate() == cluster.rest_version
        assert len(await client.get_nodes()) == len(cluster.node_names)
    finally:
        await client.close()


async def test_env_token(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUNKD_SLURM_TOKEN", cluster.token("root", 600))
    async with SlurmRestClient(cluster.rest_url) as c:
        assert c.auth_mode == "jwt-token"
        assert len(await c.get_nodes()) == len(cluster.node_names)


async def test_scontrol_missing_is_a_clear_error(
    cluster: SlurmCluster, client: SlurmRestClient
) -> None:
    # 22.05 has no REST node update; on 24.11+ the scontrol path is forced. sc1 must be
    # plainly idle first: a loaded machine can leave it DOWN "Not responding" with an
    # earlier test's reason, and the actuator (rightly) refuses to drain over that.
    cluster.scontrol("update", "nodename=sc1", "state=resume", check=False)
    await wait_node(client, "sc1", lambda n: n.state == "IDLE" and not n.is_drain
                    and "NOT_RESPONDING" not in n.flags, what="idle and responding")
    actuator = SlurmActuator(
        client, scontrol="/nonexistent/scontrol", scontrol_env=cluster.env, prefer_rest=False
    )
    with pytest.raises(ActionError, match="not installed") as info:
        await actuator.drain("sc1", "x")
    assert not info.value.retryable
    node = await wait_node(client, "sc1", lambda n: True)
    assert not node.is_drain


async def test_two_clusters_side_by_side(cluster: SlurmCluster) -> None:
    other = SlurmCluster("other[1-2]", version=cluster.version)
    await asyncio.to_thread(other.start)
    try:
        assert other.rest_port != cluster.rest_port and other.ctld_port != cluster.ctld_port
        async with jwt_client(other) as c:
            assert [n.name for n in await c.get_nodes()] == ["other1", "other2"]
        pids = set(other.daemon_pids().values())
    finally:
        await asyncio.to_thread(other.stop)
    # Exactly its own processes are gone; ours still run.
    assert not any(_alive(pid) for pid in pids)
    assert all(_alive(pid) for pid in cluster.daemon_pids().values())
    assert not other.base.exists()
    if other.root is not None:  # its private directory is unmounted from the root, too
        assert not (other.root / other.base.relative_to("/")).exists()
        assert str(cluster.root / cluster.base.relative_to("/")) in _mounts()


def _mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 here reaps orphans late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- doctor


def _doctor_settings(cluster: SlurmCluster, key: Path) -> Any:
    from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings

    # The Kubernetes half is checked in test_doctor_kubernetes.py.
    return Settings(
        slurm=SlurmSettings(url=cluster.rest_url, jwt_key_file=key),
        kubernetes=KubernetesSettings(enabled=False),
    )


async def test_doctor_prints_the_normalized_table(
    cluster: SlurmCluster, client: SlurmRestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json

    from sunkd.cli.doctor import doctor

    # scontrol as a site's login node has it (a root's through its wrapper).
    for key in ("PATH", "SLURM_CONF"):
        monkeypatch.setenv(key, cluster.env[key])
    cluster.scontrol("update", "nodename=sc5", "state=drain", "reason=admin: doctor")
    try:
        await wait_node(client, "sc5", lambda n: n.is_drain)
        out = io.StringIO()
        settings = _doctor_settings(cluster, cluster.jwt_key_path)
        assert await doctor(settings, as_json=False, out=out) == 0
        text = out.getvalue()
        assert f"REST version:   {cluster.rest_version}" in text
        assert "auth:           jwt-key" in text
        expected_updates = "rest" if client.can_update_nodes else "scontrol"
        assert f"node updates:   {expected_updates}" in text
        table = text.split("\n\n")[1].splitlines()
        # What slurmctld still lacks for slurmd pods (the harness sets ReturnToService=1
        # and no configless), with the lines to add.
        slurmd = text.split("\n\n")[2]
        assert "ok       ReturnToService = 1" in slurmd, slurmd
        assert "MISSING  configless" in slurmd
        assert "add `SlurmctldParameters=enable_configless`" in slurmd
        assert table[0].split()[:3] == ["NODE", "STATE", "FLAGS"]
        rows = {line.split()[0]: line.split() for line in table[1:]}
        assert sorted(rows) == list(cluster.node_names)
        assert rows["sc5"][1:4] == ["drained", "DRAIN", "admin:"]
        assert rows["sc5"][5] == "[root]"  # "admin: doctor [root]"
        # Never drained: no reason, and no setter either (24.11 says `root` for nodes
        # that never had a reason; the normalizer drops a setter without a reason).
        # Under load slurmctld may have marked it "Not responding" for a moment (DOWN
        # until its slurmd answers again: seen in a strict CI run), and 24.11+ keep that
        # text after the node answers: Slurm's own note, the only reason allowed here.
        sc3 = rows["sc3"]
        slurm_note = sc3[3:-3] in (["Not", "responding", "[slurm]"], ["Not", "responding"])
        assert sc3[0] == "sc3" and sc3[2] == "-" and sc3[-3:] == ["debug", "0/2", "0/0"], sc3
        assert sc3[1] == "idle" or (slurm_note and sc3[1] == "down"), sc3
        assert sc3[3:-3] == ["-"] or slurm_note, sc3
        out = io.StringIO()
        assert await doctor(settings, as_json=True, out=out) == 0
        full = json.loads(out.getvalue())
        assert full["slurmd_prerequisites"]["checked"] is True
        report = full["slurm"]
        assert report["api_version"] == cluster.rest_version
        assert {n["name"]: n["display_state"] for n in report["nodes"]}["sc5"] == "drained"
    finally:
        cluster.scontrol("update", "nodename=sc5", "state=resume")
    await wait_node(client, "sc5", lambda n: not n.is_drain)


async def test_doctor_with_a_wrong_key_is_an_auth_failure(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    import io

    from sunkd.cli.doctor import doctor

    wrong_key = tmp_path / "wrong.key"
    wrong_key.write_bytes(os.urandom(32))
    out = io.StringIO()
    assert await doctor(_doctor_settings(cluster, wrong_key), as_json=False, out=out) == 1
    assert out.getvalue().startswith("slurm: FAILED (auth)"), out.getvalue()
