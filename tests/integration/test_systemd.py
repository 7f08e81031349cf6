"""The systemd unit (packaging/systemd/): its keys, `systemd-analyze verify` and
`systemd-analyze security --offline` on it, the sysusers.d file through
`systemd-sysusers --dry-run`, the example config through sunkd's own loader, and the
sd_notify protocol end to end: `sunkd run` gets a NOTIFY_SOCKET this test created and must
send READY=1, then WATCHDOG=1 every WATCHDOG_USEC/2, and STOPPING=1 on SIGTERM.

No systemd runs as PID 1 here, so the unit is never started by systemd itself.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
UNIT_DIR = ROOT / "packaging" / "systemd"
UNIT = UNIT_DIR / "sunkd.service"
SUNKD = Path(sys.executable).parent / "sunkd"

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """systemd's ini dialect: repeated keys accumulate; comments start with # or ;."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], defaultdict(list))
            continue
        assert current is not None, f"key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current[key.strip()].append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def last(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section].get(key)
    assert values, f"{section}.{key} is not set"
    return values[-1]


def test_service_type_restart_and_environment(unit: Unit) -> None:
    assert last(unit, "Type") == "notify"
    assert last(unit, "NotifyAccess") == "main"
    watchdog = last(unit, "WatchdogSec")
    assert re.fullmatch(r"\d+s?", watchdog) and 10 <= int(watchdog.rstrip("s")) <= 120
    assert last(unit, "Restart") == "on-failure"
    assert "-/etc/sunkd/sunkd.env" in unit["Service"]["EnvironmentFile"]
    assert last(unit, "WantedBy", "Install") == "multi-user.target"
    assert "network-online.target" in last(unit, "Wants", "Unit")


def test_dedicated_user_and_state_directory(unit: Unit) -> None:
    user, group = last(unit, "User"), last(unit, "Group")
    assert user == group == "sunkd"
    assert last(unit, "StateDirectory") == "sunkd"
    assert last(unit, "WorkingDirectory") == "/var/lib/sunkd"
    env = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    assert env["SUNKD_DATABASE_URL"] == "sqlite+aiosqlite:////var/lib/sunkd/sunkd.db"
    sysusers = (UNIT_DIR / "sunkd.sysusers.conf").read_text()
    entries = [line.split() for line in sysusers.splitlines()
               if line.strip() and not line.startswith("#")]
    assert ["u", user] == entries[0][:2], "sysusers.d creates the unit's user"


def test_migrations_before_the_daemon(unit: Unit) -> None:
    pre, start = last(unit, "ExecStartPre").split(), last(unit, "ExecStart").split()
    assert pre[0] == start[0] and pre[0].startswith("/")
    assert pre[-1] == "migrate" and start[-1] == "run"
    from sunkd.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(pre[1:]).command == "migrate"
    assert parser.parse_args(start[1:]).command == "run"
    assert "HUP" in last(unit, "ExecReload")


def test_hardening(unit: Unit) -> None:
    service = unit["Service"]
    expected = {
        "ProtectSystem": "strict", "ProtectHome": "yes", "NoNewPrivileges": "yes",
        "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert last(unit, key) == value, key
    assert service["CapabilityBoundingSet"] == [""], "no capabilities at all"
    assert set(last(unit, "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET",
                                                                  "AF_INET6"}
    assert "@system-service" in service["SystemCallFilter"]
    assert not any(service.get("AmbientCapabilities", [""])), "no ambient capabilities"
    assert "ReadWritePaths" not in service, "writable: the state directory only"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze is not installed (Debian package systemd)")
    assert analyze is not None
    # verify checks that the commands exist: point them at this checkout's sunkd.
    text = UNIT.read_text().replace("/opt/sunkd/bin/sunkd", str(SUNKD))
    (tmp_path / "sunkd.service").write_text(text)
    result = subprocess.run([analyze, "verify", "--man=no", "sunkd.service"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    problems = [line for line in result.stderr.splitlines() if "sunkd.service" in line]
    assert result.returncode == 0 and not problems, result.stderr


def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze is not installed (Debian package systemd)")
    assert analyze is not None
    shutil.copy(UNIT, tmp_path / "sunkd.service")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", "sunkd.service"], cwd=tmp_path,
        capture_output=True, text=True, timeout=120, check=False)
    match = re.search(r"Overall exposure level for sunkd.service: ([\d.]+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 2.0, f"exposure {match.group(1)} (0 best, 10 worst)"


def test_sysusers_file_is_valid(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    require(sysusers is not None, "systemd-sysusers is not installed (Debian package systemd)")
    assert sysusers is not None
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", "--dry-run", str(UNIT_DIR / "sunkd.sysusers.conf")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "Creating user 'sunkd'" in result.stderr + result.stdout


def test_example_config_loads(unit: Unit) -> None:
    from sunkd.runtime.config import load_settings

    env = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    settings = load_settings(UNIT_DIR / "sunkd.toml", env=env)
    assert settings.database_url == env["SUNKD_DATABASE_URL"]
    assert settings.listen.startswith("127.0.0.1:")
    example = (UNIT_DIR / "sunkd.env.example").read_text()
    for line in example.splitlines():
        assert not line.strip() or line.startswith("#"), "the example env sets nothing live"


# -------------------------------------------------------------------------- sd_notify


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sd_notify_ready_and_watchdog(tmp_path: Path) -> None:
    """`sunkd run` under a fake systemd: READY=1 once serving, WATCHDOG=1 at half the
    watchdog period, STOPPING=1 and exit 0 on SIGTERM."""
    notify_path = tmp_path / "notify.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(notify_path))
    receiver.settimeout(0.5)
    port = free_port()
    watchdog_usec = 1_200_000
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SUNKD_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env.update({
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": str(watchdog_usec),
        "SUNKD_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'sunkd.db'}",
        "SUNKD_KUBERNETES_ENABLED": "false",
        "SUNKD_LISTEN": f"127.0.0.1:{port}",
        "SUNKD_LOG_FORMAT": "json",
    })
    migrate = subprocess.run([str(SUNKD), "migrate"], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert migrate.returncode == 0, migrate.stderr
    log_path = tmp_path / "sunkd.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([str(SUNKD), "run"], env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    messages: list[tuple[float, str]] = []

    def receive_until(predicate: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = receiver.recv(4096).decode()
            except TimeoutError:
                if process.poll() is not None:
                    break
                continue
            messages.extend((time.monotonic(), line) for line in data.splitlines())
            if predicate():  # type: ignore[operator]
                return

    def lines() -> list[str]:
        return [m for _, m in messages]

    try:
        receive_until(lambda: "READY=1" in lines(), 60)
        assert "READY=1" in lines(), f"no READY=1; log:\n{log_path.read_text()[-3000:]}"
        # READY means serving: /healthz answers.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
            assert reply.status == 200
        ready_at = next(t for t, m in messages if m == "READY=1")
        receive_until(lambda: sum(m == "WATCHDOG=1" for m in lines()) >= 5, 30)
        pings = [t for t, m in messages if m == "WATCHDOG=1" and t >= ready_at - 0.1]
        assert len(pings) >= 5, f"too few WATCHDOG=1: {messages}"
        gaps = [b - a for a, b in itertools.pairwise(pings[1:])]
        # Half of WATCHDOG_USEC (0.6 s): never slower than the watchdog period itself.
        assert max(gaps) < watchdog_usec / 1e6, gaps
        assert sum(gaps) / len(gaps) > watchdog_usec / 1e6 / 4, "pings far too frequent"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        receive_until(lambda: "STOPPING=1" in lines(), 2)
        assert "STOPPING=1" in lines()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        receiver.close()
