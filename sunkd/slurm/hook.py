"""`sunkd hook` / `sunkd-hook`: what Slurm runs as PrologSlurmctld, EpilogSlurmctld or Epilog.

Polling slurmrestd makes every Slurm change wait for the next poll; slurmctld runs its
PrologSlurmctld when it starts a job and EpilogSlurmctld (and slurmd its Epilog) when one
ends, so a hook that tells sunkd at that moment turns a poll interval into milliseconds.
The hook only says "look now": it POSTs what Slurm put in its environment (job id, node
list, partition, the time) to sunkd's `/api/v1/slurm/hook`, and sunkd reads those nodes
from slurmrestd itself (docs/slurm.md, "Hooks").

Slurm waits for this program before it starts (or finishes) the job, and a non-zero exit
of a PrologSlurmctld requeues the job (slurm.conf(5), PrologSlurmctld). So it is
fail-open: whatever goes wrong (sunkd down, bad token file, timeout, a bug here) it exits
0, except for the two cases it is asked for:

* `--chain SCRIPT` runs the site's own script first (Slurm 22.05-23.11 allow a single
  PrologSlurmctld) and exits with *its* status, whatever sunkd says;
* `--fence` (prolog-slurmctld only) asks sunkd whether every node of the job is
  Slurm's in sunkd's current term; only an explicit "no" exits 1, so slurmctld requeues
  the job instead of starting it on a node being handed to Kubernetes.

Standard library only, and nothing of sunkd is imported: slurmctld runs it for every job,
as SlurmUser, possibly with the system python3 (its start time is measured in
bench/hooks.py). Settings come from flags, else `SUNKD_HOOK_*` variables, else the file
`--config` (default /etc/sunkd/hook.conf: `key = value` lines, keys `url`, `token_file`,
`timeout`, `fence`), because Slurm runs the program without arguments or the site's
environment: a one-line wrapper script, or the config file, says where sunkd is.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # `typing` and `collections.abc` cost ~8 ms of the hook's start
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

EVENTS = ("prolog-slurmctld", "epilog-slurmctld", "epilog")
DEFAULT_CONFIG = "/etc/sunkd/hook.conf"
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE = "/etc/sunkd/hook-token"
# Slurm waits for the hook: a hint is worth little after a few hundred ms, and the poll
# catches up anyway. The fence waits a little longer but still fails open.
DEFAULT_TIMEOUT = 0.5
MAX_TIMEOUT = 10.0
PATH = "/api/v1/slurm/hook"
# The node list as Slurm gives it (a hostlist); longer ones are cut, sunkd then reads
# what it can name (and polls the rest).
MAX_NODELIST = 4096
# What the fence answers to refuse: exit status 1 makes slurmctld requeue the job.
REFUSED = 1

USAGE = f"""usage: sunkd-hook {{{'|'.join(EVENTS)}}} [--chain SCRIPT] [--fence]
                  [--url URL] [--token-file FILE] [--timeout SECONDS] [--config FILE]

Tell sunkd that Slurm started or ended a job (run it as PrologSlurmctld,
EpilogSlurmctld or Epilog). Always exits 0, except: with --chain, the site
script's exit status; with --fence, 1 when sunkd answers that a node of the job
is not Slurm's to run jobs on."""


class UsageError(Exception):
    pass


def parse_args(argv: Sequence[str]) -> dict[str, str | bool]:
    """The event and the flags; raises UsageError (the caller still exits 0)."""
    if not argv or argv[0] not in EVENTS:
        raise UsageError(f"the first argument must be one of {', '.join(EVENTS)}")
    options: dict[str, str | bool] = {"event": argv[0]}
    rest = list(argv[1:])
    while rest:
        flag = rest.pop(0)
        if flag == "--fence":
            options["fence"] = True
            continue
        name, eq, value = flag.partition("=")
        if name not in ("--chain", "--url", "--token-file", "--timeout", "--config"):
            raise UsageError(f"unknown argument {flag!r}")
        if not eq:
            if not rest:
                raise UsageError(f"{name} needs a value")
            value = rest.pop(0)
        options[name[2:].replace("-", "_")] = value
    return options


def read_config(path: str) -> dict[str, str]:
    """`key = value` lines (# comments; quotes around a value are dropped); a missing
    file is an empty config."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(65536)
    except FileNotFoundError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip("\"'")
    return values


def settings(options: Mapping[str, str | bool], env: Mapping[str, str]) -> dict[str, str]:
    """Flags, else SUNKD_HOOK_* variables, else the config file, else defaults."""
    config_path = str(options.get("config") or env.get("SUNKD_HOOK_CONFIG") or DEFAULT_CONFIG)
    config = read_config(config_path)
    defaults = {"url": DEFAULT_URL, "token_file": DEFAULT_TOKEN_FILE,
                "timeout": str(DEFAULT_TIMEOUT), "fence": ""}
    result: dict[str, str] = {}
    for key, default in defaults.items():
        flag = options.get(key)
        if isinstance(flag, bool):
            result[key] = "true" if flag else ""
        elif flag:
            result[key] = flag
        else:
            result[key] = env.get(f"SUNKD_HOOK_{key.upper()}") or config.get(key) or default
    return result


def payload(event: str, env: Mapping[str, str], *, fence: bool, now: float) -> dict[str, object]:
    """What Slurm told us, as sunkd's API takes it. An Epilog runs on one node
    (SLURMD_NODENAME); the controller's hooks see the job's whole node list."""
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if event == "epilog" and env.get("SLURMD_NODENAME"):
        nodes = env["SLURMD_NODENAME"]
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
    body: dict[str, object] = {
        "event": event,
        "job_id": int(job) if job.isdigit() and len(job) < 19 else 0,
        "nodes": nodes[:MAX_NODELIST],
        "partition": (env.get("SLURM_JOB_PARTITION") or "")[:256],
        "sent_at": now,
    }
    if fence:
        body["fence"] = True
    return body


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of http(s)://host[:port][/prefix]."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"url must be http(s)://host:port, got {url!r}")
    hostport, _, prefix = rest.partition("/")
    host, port = hostport, 443 if scheme == "https" else 80
    if hostport.startswith("["):  # [::1]:8080
        host, _, tail = hostport[1:].partition("]")
        if tail.startswith(":"):
            port = int(tail[1:])
    elif ":" in hostport:
        host, _, number = hostport.rpartition(":")
        port = int(number)
    if not host:
        raise ValueError(f"url has no host: {url!r}")
    return scheme, host, port, "/" + prefix.strip("/") if prefix.strip("/") else ""


def post(url: str, token: str, body: Mapping[str, object], timeout: float
         ) -> tuple[int, dict[str, object]]:
    """(status, JSON answer or {}) of one POST; raises OSError/ValueError on failure.

    HTTP/1.1 by hand on a socket: `http.client` pulls in the `email` package, which
    tripled this program's start time, and Slurm waits for it on every job. `_socket`,
    not `socket`: the latter's enum conversions cost more than the rest of the program
    (https needs `ssl`, which imports it anyway)."""
    import _socket

    scheme, host, port, prefix = split_url(url)
    data = encode(body).encode()
    head = (f"POST {prefix}{PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    deadline = time.monotonic() + timeout
    # Bytes for an ASCII host: a str goes through the idna codec, which imports `re`
    # (a third of this program's start).
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    family, kind, proto, _, address = _socket.getaddrinfo(name, port, 0,
                                                           _socket.SOCK_STREAM)[0]
    sock: Any = _socket.socket(family, kind, proto)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        if scheme == "https":
            import socket
            import ssl

            sock = ssl.create_default_context().wrap_socket(
                socket.socket(fileno=sock.detach()), server_hostname=host)
        sock.sendall(head.encode() + data)
        raw = b""
        while len(raw) < 65536:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
            header_end = raw.find(b"\r\n\r\n")
            if header_end >= 0 and _complete(raw, header_end):
                break
    finally:
        sock.close()
    status_line, _, rest = raw.partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    _, _, content = rest.partition(b"\r\n\r\n")
    answer: object = {}
    if content:
        import json  # only now: it imports `re`, a third of this program's start

        try:
            answer = json.loads(content)
        except ValueError:
            answer = {}
    return int(parts[1]), answer if isinstance(answer, dict) else {}


def encode(body: Mapping[str, object]) -> str:
    """A flat JSON object of str, int, float and bool values (without importing json)."""
    items = []
    for key, value in body.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value) if value == value and abs(value) != float("inf") else "null"
        else:
            text = _quote(str(value))
        items.append(f"{_quote(key)}:{text}")
    return "{" + ",".join(items) + "}"


def _quote(text: str) -> str:
    escaped = []
    for char in text:
        if char in "\"\\":
            escaped.append("\\" + char)
        elif ord(char) < 0x20:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _complete(raw: bytes, header_end: int) -> bool:
    """The whole answer is in `raw` (by its Content-Length)."""
    for line in raw[:header_end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(raw) - header_end - 4 >= int(value.strip())
    return False


def warn(message: str) -> None:
    # slurmctld keeps a hook's stderr nowhere by default: this is for people running it.
    try:
        print(f"sunkd-hook: {message}", file=sys.stderr)
    except (OSError, ValueError):
        pass


def tell_sunkd(options: Mapping[str, str | bool], env: Mapping[str, str]) -> int:
    """POST the hook; the exit status the fence asks for (0 unless an explicit no)."""
    config = settings(options, env)
    try:
        timeout = min(max(float(config["timeout"]), 0.01), MAX_TIMEOUT)
    except ValueError:
        timeout = DEFAULT_TIMEOUT
    fence = config["fence"].lower() in ("1", "true", "yes", "on")
    event = str(options["event"])
    fence = fence and event == "prolog-slurmctld"
    with open(config["token_file"], encoding="utf-8") as handle:
        token = handle.read(4096).strip()
    status, answer = post(config["url"], token, payload(event, env, fence=fence,
                                                        now=time.time()), timeout)
    if status >= 300:
        warn(f"sunkd answered {status}: {str(answer.get('error', ''))[:200]}")
        return 0
    if fence and answer.get("allow") is False:
        warn(f"fence: {str(answer.get('why', 'a node is not Slurm-owned'))[:300]}")
        return REFUSED
    return 0


def run_chain(script: str) -> int:
    """The site's own script, with Slurm's environment; its status is ours. Spawned with
    `os` alone: importing `subprocess` took longer than the rest of the hook's start."""
    try:
        pid = os.posix_spawnp(script, [script], os.environ)
        _, status = os.waitpid(pid, 0)
    except OSError as error:
        warn(f"cannot run --chain {script}: {error}")
        return 1  # the site's script did not run: say so to Slurm, as it would have
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code  # killed by a signal: as sh reports it


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        options = parse_args(arguments)
    except UsageError as error:
        warn(f"{error}\n{USAGE}")
        return 0  # a mistyped slurm.conf line must not stop every job
    status = 0
    chain = options.get("chain")
    if isinstance(chain, str) and chain:
        status = run_chain(chain)
        if status != 0:
            options = {**options, "fence": False}  # the site refused the job already
    try:
        fenced = tell_sunkd(options, os.environ)
    except Exception as error:  # fail-open: nothing here may fail the job
        warn(f"{type(error).__name__}: {error}")
        return status
    return status or fenced


if __name__ == "__main__":
    sys.exit(main())
