"""`sunkd hook` (sunkd/slurm/hook.py) on its own: arguments, what it sends, fail-open,
the chained site script's exit status; the API side's parsing and rate limit
(sunkd/api/hooks.py); the fence's verdict (sunkd/domain/fence.py). Against slurmctld
and the daemon: tests/integration/test_slurm_hooks.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunkd.api.hooks import BadHook, TokenBucket, parse_hook
from sunkd.domain import wellknown as wk
from sunkd.domain.events import SlurmNodeObserved
from sunkd.domain.fence import fence_verdict
from sunkd.domain.state import ClusterState, NodeState, OpenTransition
from sunkd.slurm import hook

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "n[1-2]", "SUNKD_HOOK_CONFIG": "/nonexistent"}
    return subprocess.run([sys.executable, "-m", "sunkd.slurm.hook", *args],
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=30)


def test_arguments() -> None:
    assert hook.parse_args(["epilog", "--chain", "/x", "--url=http://h:1"]) == {
        "event": "epilog", "chain": "/x", "url": "http://h:1"}
    assert hook.parse_args(["prolog-slurmctld", "--fence"])["fence"] is True
    for bad in ([], ["prolog"], ["epilog", "--nope"], ["epilog", "--url"]):
        with pytest.raises(hook.UsageError):
            hook.parse_args(bad)


def test_payload_from_slurms_environment() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-3]", "SLURM_JOB_PARTITION": "p",
           "SLURMD_NODENAME": "gpu2"}
    assert hook.payload("prolog-slurmctld", env, fence=True, now=5.0) == {
        "event": "prolog-slurmctld", "job_id": 7, "nodes": "gpu[1-3]", "partition": "p",
        "sent_at": 5.0, "fence": True}
    # slurmd's Epilog runs on one node of the job: that node is what ended there.
    assert hook.payload("epilog", env, fence=False, now=5.0)["nodes"] == "gpu2"
    assert hook.payload("epilog", {"SLURM_JOBID": "x"}, fence=False, now=1.0)["job_id"] == 0


def test_settings_flags_then_environment_then_file(tmp_path: Path) -> None:
    config = tmp_path / "hook.conf"
    config.write_text("# site\nurl = 'http://file:1'\ntoken_file=/f\nfence = true\n")
    chosen = hook.settings({"event": "epilog", "config": str(config), "url": "http://flag:1"},
                           {"SUNKD_HOOK_TOKEN_FILE": "/env"})
    assert chosen == {"url": "http://flag:1", "token_file": "/env", "timeout": "0.5",
                      "fence": "true"}


@pytest.mark.parametrize(("url", "parts"), [
    ("http://127.0.0.1:8080", ("http", "127.0.0.1", 8080, "")),
    ("https://sunkd.example/prefix/", ("https", "sunkd.example", 443, "/prefix")),
    ("http://[::1]:9", ("http", "::1", 9, "")),
])
def test_split_url(url: str, parts: tuple[str, str, int, str]) -> None:
    assert hook.split_url(url) == parts


@given(st.dictionaries(st.text(max_size=20), st.one_of(
    st.text(max_size=50), st.integers(-2**62, 2**62), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False)), max_size=8))
def test_encode_is_json(body: dict[str, object]) -> None:
    assert json.loads(hook.encode(body)) == body


def test_fails_open_when_sunkd_is_unreachable_or_misconfigured(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    unreachable = _run("prolog-slurmctld", "--fence", "--url",
                       f"http://127.0.0.1:{_closed_port()}", "--token-file", str(token))
    assert unreachable.returncode == 0, unreachable.stderr
    assert "Connection refused" in unreachable.stderr
    for args in (["prolog-slurmctld", "--token-file", str(tmp_path / "missing")],
                 ["no-such-event"], ["epilog", "--url", "ftp://x"]):
        result = _run(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stderr.startswith("sunkd-hook: ")


@pytest.mark.parametrize("code", [0, 3])
def test_chained_site_scripts_exit_status_is_kept(tmp_path: Path, code: int) -> None:
    site = tmp_path / "site.sh"
    marker = tmp_path / "ran"
    site.write_text(f'#!/bin/sh\necho "$SLURM_JOB_ID" > {marker}\nexit {code}\n')
    site.chmod(0o755)
    result = _run("prolog-slurmctld", "--chain", str(site), "--url",
                  f"http://127.0.0.1:{_closed_port()}", "--token-file", "/nonexistent")
    assert result.returncode == code
    assert marker.read_text().strip() == "42"
    missing = _run("epilog-slurmctld", "--chain", str(tmp_path / "absent.sh"))
    assert missing.returncode == 1  # the site's script could not run: Slurm is told


def test_the_hook_imports_nothing_heavy() -> None:
    """Slurm waits for it on every job: neither sunkd's packages nor http.client/json."""
    code = ("import sys, sunkd.slurm.hook; heavy = [m for m in sys.modules if m.startswith("
            "('aiohttp', 'structlog', 'sunkd.domain', 'sunkd.runtime', 'email', 'json', "
            "'http', 'subprocess', 'ssl'))]; print(heavy)")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ,
                            "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_the_hook_run_as_a_file_chains_without_importing_subprocess_or_typing(
        tmp_path: Path) -> None:
    """Every import is start time Slurm waits for: run as the file with `-I -S` (no
    `site`, no package), the chain is spawned with `os` alone, the annotations cost
    nothing at run time, and an ASCII host is resolved without the idna codec (which
    imports `re`)."""
    site = tmp_path / "site.sh"
    marker = tmp_path / "ran"
    site.write_text(f'#!/bin/sh\necho "$SLURM_JOB_ID" > {marker}\nexit 3\n')
    site.chmod(0o755)
    token = tmp_path / "token"
    token.write_text("secret\n")
    code = (f"import sys; sys.argv = ['hook', 'prolog-slurmctld', '--chain', {str(site)!r}, "
            f"'--url', 'http://127.0.0.1:{_closed_port()}', '--token-file', {str(token)!r}]; "
            f"sys.path.insert(0, {str(REPO / 'sunkd' / 'slurm')!r}); import hook; "
            "status = hook.main(); heavy = [m for m in sys.modules if m in ('subprocess', "
            "'typing', 'collections.abc', 'runpy', 'site', 'sunkd', 'encodings.idna', 're')]"
            "; print(status, heavy)")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                            text=True, check=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42"})
    assert result.stdout.strip() == "3 []", result.stderr
    assert "Connection refused" in result.stderr  # it did try to reach sunkd
    assert marker.read_text().strip() == "42"


# ----------------------------------------------------------------------- API side


def test_parse_hook_accepts_what_the_hook_sends() -> None:
    body = hook.encode(hook.payload("prolog-slurmctld", {"SLURM_JOB_ID": "9",
                                                         "SLURM_JOB_NODELIST": "a[1-2]"},
                                    fence=True, now=10.5)).encode()
    parsed, fence = parse_hook(body, 11.0)
    assert fence is True
    assert (parsed.event, parsed.job_id, parsed.nodes, parsed.sent_at, parsed.received_at) == (
        "prolog-slurmctld", 9, "a[1-2]", 10.5, 11.0)


@pytest.mark.parametrize("body", [
    b"", b"[]", b"{", b'{"event": "prolog"}', b'{"event": "epilog", "job_id": -1}',
    b'{"event": "epilog", "job_id": true}', b'{"event": "epilog", "nodes": 3}',
    b'{"event": "epilog", "sent_at": "now"}', b'{"event": "epilog", "fence": 1}',
    b'{"event": "epilog", "nodes": "' + b"a" * 9000 + b'"}',
])
def test_parse_hook_refuses_anything_else(body: bytes) -> None:
    with pytest.raises(BadHook):
        parse_hook(body, 0.0)


def test_token_bucket_limits_the_rate_and_refills() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])
    assert sum(bucket.take() for _ in range(100)) == 20  # the burst: ten seconds' worth
    now[0] += 1.0
    assert [bucket.take() for _ in range(3)] == [True, True, False]


# ------------------------------------------------------------------------- fence


def _node(name: str, owner: str, transition: OpenTransition | None = None) -> NodeState:
    return NodeState(name=name, owner=owner, transition=transition,
                     slurm=SlurmNodeObserved(node=name, state="IDLE"))


def _move(source: str, to: str, done: tuple[str, ...] = ()) -> OpenTransition:
    return OpenTransition("t1", "pool", source, to, 0.0, "because", done)


@given(st.lists(st.sampled_from(["slurm", "k8s", "lending", "reclaiming", "resumed",
                                 "absent", "none"]), max_size=6))
def test_fence_refuses_exactly_when_a_node_is_not_slurms(kinds: list[str]) -> None:
    nodes = {}
    for index, kind in enumerate(kinds):
        name = f"n{index}"
        if kind == "slurm":
            nodes[name] = _node(name, wk.OWNER_SLURM)
        elif kind == "none":
            nodes[name] = _node(name, "none")
        elif kind == "k8s":
            nodes[name] = _node(name, wk.OWNER_KUBERNETES)
        elif kind == "lending":
            nodes[name] = _node(name, wk.OWNER_SLURM, _move(wk.OWNER_SLURM, wk.OWNER_KUBERNETES))
        elif kind == "reclaiming":
            nodes[name] = _node(name, wk.OWNER_KUBERNETES,
                                _move(wk.OWNER_KUBERNETES, wk.OWNER_SLURM))
        elif kind == "resumed":
            nodes[name] = _node(name, wk.OWNER_KUBERNETES, _move(
                wk.OWNER_KUBERNETES, wk.OWNER_SLURM, ("slurm/resume",)))
    state = ClusterState(nodes=nodes)
    allow, why = fence_verdict(state, [f"n{i}" for i in range(len(kinds))])
    assert allow == (not {"k8s", "lending", "reclaiming"} & set(kinds))
    assert why.startswith("sunkd: ") != allow


def test_sunkd_hook_subcommand_is_the_same_program() -> None:
    from sunkd.cli.main import main

    assert main(["hook", "epilog", "--url", f"http://127.0.0.1:{_closed_port()}",
                 "--token-file", "/nonexistent"]) == 0


async def test_the_route_authenticates_bounds_and_limits(tmp_path: Path) -> None:
    """The real route over HTTP, with the daemon's receiver in no leadership term."""
    from aiohttp.test_utils import TestClient, TestServer

    from sunkd.api.app import build_app
    from sunkd.api.hooks import HookEndpoint
    from sunkd.api.metrics import Metrics
    from sunkd.runtime.hooks import HookReceiver

    class View:
        metrics = Metrics()
        event_log = None

        def state(self) -> ClusterState:
            return ClusterState()

        def pools(self) -> list[object]:
            return []

        def is_leader(self) -> bool:
            return False

        def is_ready(self) -> tuple[bool, str]:
            return True, "standby"

    view = View()
    token = tmp_path / "token"
    token.write_text("right\n")
    receiver = HookReceiver(state=view.state, may_act=view.is_leader, metrics=view.metrics)
    endpoint = HookEndpoint(receiver, token_file=token, rate=1.0, metrics=view.metrics)
    body = hook.encode({"event": "epilog-slurmctld", "job_id": 1, "nodes": "n1"})
    async with TestClient(TestServer(build_app(view, hooks=endpoint))) as client:  # type: ignore[arg-type]
        async def post(data: str, bearer: str = "right") -> int:
            response = await client.post("/api/v1/slurm/hook", data=data,
                                         headers={"Authorization": f"Bearer {bearer}"})
            return response.status

        assert await post(body, "wrong") == 401
        assert await post("{", "right") == 400
        assert await post("x" * 20000) == 413
        assert await post(body) == 503  # not the leader: the hook exits 0, polling stays
        statuses = [await post(body) for _ in range(12)]
        assert 429 in statuses  # 1 a second, bursts of 10
    rendered = view.metrics.render().decode()
    for result in ("unauthorized", "bad_request", "too_large", "not_leader", "rate_limited"):
        assert f'result="{result}"' in rendered


@pytest.mark.parametrize(("observed", "again"), [
    # What slurmrestd 22.05 answers right after EpilogSlurmctld of the node's only job
    # (measured with bench/hooks.py --trace): no COMPLETING flag, no job, but the CPUs
    # are still allocated. The policy sees it busy, so the end hook must read again.
    (SlurmNodeObserved(node="n1", state="IDLE", flags=("DRAIN",), alloc_cpus=2), True),
    (SlurmNodeObserved(node="n1", state="ALLOCATED", flags=("COMPLETING",), alloc_cpus=2),
     True),
    (SlurmNodeObserved(node="n1", state="IDLE", flags=("COMPLETING", "DRAIN")), True),
    (SlurmNodeObserved(node="n1", state="IDLE", flags=("DRAIN",)), False),
    (SlurmNodeObserved(node="n1", state="IDLE"), False),
    # Another job still runs there: no read will see it free before that job ends.
    (SlurmNodeObserved(node="n1", state="MIXED", alloc_cpus=1, jobs=1), False),
    (None, False),
])
def test_an_end_hook_reads_again_while_the_node_still_cleans_up(
        observed: SlurmNodeObserved | None, again: bool) -> None:
    from sunkd.runtime.hooks import cleaning_up

    assert cleaning_up(observed) is again


def test_an_end_hooks_first_confirm_read_is_due_at_once() -> None:
    """End hooks arrive before the node is free; the first read again is not put off by
    a pause (the read that saw the node cleaning up took that long already)."""
    import time

    from sunkd.api.metrics import Metrics
    from sunkd.domain.events import SlurmHookReceived
    from sunkd.runtime.hooks import HookReceiver

    class Source:
        nodes = {"n1": SlurmNodeObserved(node="n1", state="IDLE", flags=("COMPLETING",))}

    receiver = HookReceiver(state=ClusterState, may_act=lambda: True, metrics=Metrics())
    end = SlurmHookReceived(event="epilog-slurmctld", job_id=1, nodes="n1", partition="",
                            sent_at=None, received_at=0.0)
    receiver._schedule_confirms(Source(), [(end, ("n1",))], [])  # type: ignore[arg-type]
    attempt, due = receiver._confirm["n1"]
    assert attempt == 0 and due <= time.monotonic()


def test_confirm_reads_follow_each_other_while_the_node_still_cleans_up() -> None:
    """COMPLETING lasts a few tens of ms after the end hook arrives (measured on 22.05.8
    with bench/hooks.py --trace: the read at once still saw it, the one 20 ms later did
    not): the first reads again follow each other without a pause (each takes the
    length of a `GET /nodes`), then the pauses grow."""
    import time

    from sunkd.api.metrics import Metrics
    from sunkd.runtime.hooks import HookReceiver

    class Source:
        nodes = {"n1": SlurmNodeObserved(node="n1", state="IDLE", flags=("COMPLETING",))}

    receiver = HookReceiver(state=ClusterState, may_act=lambda: True, metrics=Metrics())
    receiver._confirm["n1"] = (0, time.monotonic())
    receiver._schedule_confirms(Source(), [], ["n1"])  # type: ignore[arg-type]
    attempt, due = receiver._confirm["n1"]
    assert attempt == 1 and due <= time.monotonic()
