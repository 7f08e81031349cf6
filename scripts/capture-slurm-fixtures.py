#!/usr/bin/env python3
"""Capture live slurmrestd answers into tests/fixtures/slurm/ (the fixtures' provenance).

    .venv/bin/python scripts/capture-slurm-fixtures.py 24.11 [--out DIR]

Starts a private cluster of that Slurm generation (sunkd_testbed.slurm; 24.11 and 26.05
from the roots of scripts/prepare-slurm-root.sh), walks four nodes through the states
sunkd reads (idle, mixed/allocated, draining, drained, just resumed, admin DOWN, DOWN +
NOT_RESPONDING) and stores each answer unchanged, per REST version:

* `vX_<what>.json` - the JSON body of a GET, byte for byte;
* `vX_<what>.http` - the raw HTTP bytes of an error answer (status line, headers, body
  and anything the server sent after it), for the framing faults of 24.11/26.05;
* `captures-<slurm release>.json` - what was requested, when, the HTTP status, and the
  Slurm packages the answers came from.

Only the REST version sunkd negotiates gets every state; the others served (26.05:
v0.0.43, v0.0.44) get the states whose shape matters. tests/fixtures/slurm/README.md
says which file shows what.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sunkd.slurm.auth import mint_jwt
from sunkd_testbed.slurm import SLURM_VERSIONS, SlurmCluster, root_stamp

# Per generation: the negotiated REST version (every state) and the other served ones
# captured for the states listed in PARTIAL.
VERSIONS = {
    "22.05": ("v0.0.38", ()),
    "24.11": ("v0.0.42", ()),
    "26.05": ("v0.0.45", ("v0.0.44", "v0.0.43")),
}
PARTIAL = {"nodes_draining", "nodes_down_not_responding", "jobs_running", "node_unknown"}
NODES = "cap[1-4]"


def raw_http(cluster: SlurmCluster, path: str, headers: dict[str, str]) -> tuple[bytes, float]:
    """One request on a fresh connection; every byte until the server closes or 15 s
    of silence (slurmrestd closes after an error; keeps the connection otherwise)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{cluster.rest_port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", cluster.rest_port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        sock.settimeout(15)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"Connection: Close" not in data and _complete(data):
                    break  # a kept-alive connection: the answer is complete
        except TimeoutError:
            pass
    return data, time.monotonic() - started


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


class Capture:
    def __init__(self, cluster: SlurmCluster, out: Path, version: str) -> None:
        self.cluster = cluster
        self.out = out
        self.main, self.others = VERSIONS[version]
        self.index: list[dict[str, Any]] = []

    def get(self, what: str, path: str) -> Any:
        """GET `path` in every REST version this state is captured for; store the bodies."""
        parsed: Any = None
        versions = [self.main, *(self.others if what in PARTIAL else ())]
        for rest in versions:
            status, body = self.cluster.rest_get(f"/slurm/{rest}/{path}")
            name = f"{rest}_{what}.json"
            (self.out / name).write_bytes(body)
            self.index.append(
                {
                    "file": name,
                    "request": f"GET /slurm/{rest}/{path}",
                    "status": status,
                    "at": _now(),
                }
            )
            if rest == self.main:
                parsed = json.loads(body)
        return parsed

    def raw(self, what: str, path: str, headers: dict[str, str], note: str) -> None:
        data, elapsed = raw_http(self.cluster, f"/slurm/{self.main}/{path}", headers)
        name = f"{self.main}_{what}_raw.http"
        (self.out / name).write_bytes(data)
        status = data.split(b"\r\n", 1)[0].decode(errors="replace")
        self.index.append(
            {
                "file": name,
                "request": f"GET /slurm/{self.main}/{path}",
                "status": status,
                "seconds": round(elapsed, 2),
                "note": note,
                "at": _now(),
            }
        )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nodes(body: Any) -> dict[str, Any]:
    return {n["name"]: n for n in body["nodes"]}


def _flags(node: Any) -> list[str]:
    state = node["state"]
    return state if isinstance(state, list) else [state.upper(), *(node.get("state_flags") or [])]


def wait(cap: Capture, predicate: Any, what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        status, body = cap.cluster.rest_get(f"/slurm/{cap.main}/nodes")
        if status == 200 and predicate(_nodes(json.loads(body))):
            return
        time.sleep(0.2)
    raise SystemExit(f"timeout waiting for {what}")


def post_state(cluster: SlurmCluster, rest: str, node: str, state: str, reason: str = "") -> None:
    import http.client

    body: dict[str, Any] = {"state": [state]}
    if reason:
        body["reason"] = reason
    connection = http.client.HTTPConnection("127.0.0.1", cluster.rest_port, timeout=30)
    try:
        connection.request(
            "POST",
            f"/slurm/{rest}/node/{node}",
            body=json.dumps(body),
            headers={
                "X-SLURM-USER-NAME": "root",
                "X-SLURM-USER-TOKEN": cluster.token(),
                "Content-Type": "application/json",
            },
        )
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"POST node/{node} {state}: HTTP {response.status}")
    finally:
        connection.close()


def drain(cluster: SlurmCluster, rest: str, node: str, state: str, reason: str = "") -> None:
    if rest >= "v0.0.39":
        post_state(cluster, rest, node, state, reason)
    else:
        args = ["update", f"nodename={node}", f"state={state.lower()}"]
        cluster.scontrol(*args, *([f"reason={reason}"] if reason else []))


def capture(version: str, out: Path) -> Path:
    cluster = SlurmCluster(NODES, version=version, slurmd_timeout=5)
    cluster.start()
    try:
        cap = Capture(cluster, out, version)
        rest = cap.main
        if cluster.rest_version != rest:
            raise SystemExit(f"negotiated {cluster.rest_version}, expected {rest}")
        cap.get("ping", "ping")
        cap.get("nodes_idle", "nodes")
        mixed = cluster.sbatch(nodelist="cap1", cpus=1)
        full = cluster.sbatch(nodelist="cap2", cpus=2)
        pending = cluster.sbatch(nodelist="cap2", cpus=2)
        wait(
            cap,
            lambda n: "MIXED" in _flags(n["cap1"]) and "ALLOCATED" in _flags(n["cap2"]),
            "cap1 mixed, cap2 allocated",
        )
        cap.get("nodes_busy", "nodes")
        cap.get("jobs_running", "jobs")
        drain(cluster, rest, "cap1", "DRAIN", "sunkd: lent to kubernetes [tx cap1]")
        drain(cluster, rest, "cap2", "DRAIN", "sunkd: lent to kubernetes [tx cap2]")
        wait(
            cap,
            lambda n: "DRAIN" in _flags(n["cap1"]) and "DRAIN" in _flags(n["cap2"]),
            "cap1, cap2 draining",
        )
        cap.get("nodes_draining", "nodes")
        cluster.scancel(mixed, full, pending)
        wait(
            cap,
            lambda n: all(
                "ALLOCATED" not in _flags(n[x])
                and "MIXED" not in _flags(n[x])
                and "COMPLETING" not in _flags(n[x])
                for x in ("cap1", "cap2")
            ),
            "cap1, cap2 drained",
        )
        cap.get("jobs_after_cancel", "jobs")
        cap.get("nodes_drained", "nodes")
        drain(cluster, rest, "cap1", "RESUME")
        cap.get("nodes_just_resumed", "nodes")  # 24.11: the old reason stays on cap1
        drain(cluster, rest, "cap2", "UNDRAIN")
        time.sleep(1.5)
        cap.get("nodes_undrained", "nodes")
        cluster.scontrol("update", "nodename=cap3", "state=down", "reason=admin: cable")
        cluster.kill_slurmd("cap4")
        wait(
            cap,
            lambda n: "DOWN" in _flags(n["cap4"]) and "NOT_RESPONDING" in _flags(n["cap4"]),
            "cap4 DOWN+NOT_RESPONDING",
            within=60,
        )
        cap.get("nodes_down_not_responding", "nodes")
        cap.get("node_cap3_down", "node/cap3")
        cap.get("node_unknown", "node/nosuchnode")
        key = cluster.jwt_key_path.read_bytes()
        wrong = mint_jwt(os.urandom(32), "root")
        expired = mint_jwt(key, "root", 60, now=time.time() - 3600)
        cap.raw(
            "nodes_bad_token",
            "nodes",
            {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": wrong},
            "a token signed with another key",
        )
        cap.raw(
            "ping_bad_token",
            "ping",
            {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": wrong},
            "a token signed with another key: the ping itself",
        )
        cap.raw(
            "nodes_expired_token",
            "nodes",
            {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": expired},
            "a token that expired an hour ago",
        )
        cap.raw("nodes_no_token", "nodes", {}, "no X-SLURM-USER-* headers")
        cluster.stop_slurmctld()
        cap.raw(
            "nodes_controller_down",
            "nodes",
            {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": cluster.token()},
            "slurmctld stopped (SIGTERM)",
        )
        cluster.start_slurmctld()
        cluster.start_slurmd("cap4", wait=False)
        suite = cluster.runtime.suite if cluster.runtime else None
        stamp = root_stamp(suite) if suite and cluster.root is not None else None
        provenance = {
            "slurm": cluster.slurm_version,
            "generation": version,
            "from": (
                f"Debian {suite} root (scripts/prepare-slurm-root.sh), "
                f"packages {stamp.get('packages') if stamp else '?'}"
                if cluster.root is not None
                else "the host's Debian packages"
            ),
            "harness": "sunkd_testbed.slurm.SlurmCluster (private cluster, 4 x slurmd -N)",
            "captured_by": "scripts/capture-slurm-fixtures.py",
            "captured_at": _now(),
            "files": cap.index,
        }
        manifest = out / f"captures-{cluster.slurm_version}.json"
        manifest.write_text(json.dumps(provenance, indent=1) + "\n")
        return manifest
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("version", choices=SLURM_VERSIONS)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "slurm",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally: stop the cluster
    print(capture(args.version, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
