"""kubeconfig.py (kubernetes-asyncio's loaders, and what sunkd adds to them) on files and
plugin scripts (the wire is tests/integration/test_kube_config.py and every real-plane test,
whose kubeconfigs carry certificates or bound tokens)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import gc
import json
import os
import shutil
import ssl
import stat
import sys
import time
from pathlib import Path
from typing import Any

import certifi
import pytest
import yaml
from kubernetes_asyncio.config import incluster_config

from sunkd.kubernetes import kubeconfig
from sunkd.kubernetes.kubeconfig import (
    CredentialUnavailable,
    KubeConfigError,
    in_cluster,
    load_kubeconfig,
)


def _write(path: Path, clusters: dict[str, Any], users: dict[str, Any],
           contexts: dict[str, tuple[str, str]], current: str | None = None) -> Path:
    document: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": {"cluster": c, "user": u}}
                     for n, (c, u) in contexts.items()],
    }
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def _plain(path: Path, user: dict[str, Any], server: str = "http://127.0.0.1:1") -> Path:
    return _write(path, {"c": {"server": server}}, {"u": user}, {"x": ("c", "u")}, "x")


async def _auth(path: Path, context: str | None = None) -> dict[str, str]:
    return await (await load_kubeconfig(str(path), context)).credentials.authorization()


async def test_files_merge_first_wins_and_paths_resolve_against_their_file(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "token").write_text("from-a\n")
    (tmp_path / "b" / "token").write_text("from-b\n")
    first = _write(tmp_path / "a" / "config", {"c": {"server": "http://first:1"}},
                   {"u": {"tokenFile": "token"}}, {"one": ("c", "u")}, "one")
    second = _write(tmp_path / "b" / "config", {"c": {"server": "http://second:1"},
                                                "d": {"server": "http://other:2/"}},
                    {"u": {"token": "ignored"}, "v": {"tokenFile": "token"}},
                    {"one": ("d", "v"), "two": ("d", "v")}, "two")
    paths = f"{first}{os.pathsep}{tmp_path / 'missing'}{os.pathsep}{second}"
    endpoint = await load_kubeconfig(paths)
    assert endpoint.server == "http://first:1"  # current-context and names: first file
    assert await endpoint.credentials.authorization() == {"Authorization": "Bearer from-a"}
    other = await load_kubeconfig(paths, "two")
    assert other.server == "http://other:2"
    assert await other.credentials.authorization() == {"Authorization": "Bearer from-b"}


async def test_a_missing_context_cluster_or_user_says_which(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", {"c": {"server": "http://s:1"}}, {"u": {}},
                  {"x": ("c", "u"), "y": ("nope", "u"), "z": ("c", "ghost")})
    with pytest.raises(KubeConfigError, match="no current-context"):
        await load_kubeconfig(str(path))
    with pytest.raises(KubeConfigError, match=r"object with name w in \S*contexts list"):
        await load_kubeconfig(str(path), "w")
    with pytest.raises(KubeConfigError, match=r"object with name nope in \S*clusters list"):
        await load_kubeconfig(str(path), "y")
    # The library would send no credentials; client-go refuses, and so does sunkd.
    with pytest.raises(KubeConfigError, match="names user 'ghost'"):
        await load_kubeconfig(str(path), "z")
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="cannot read the kubeconfig"):
        await load_kubeconfig(str(tmp_path / "broken"))
    with pytest.raises(KubeConfigError, match="names no existing file"):
        await load_kubeconfig(str(tmp_path / "absent"))
    serverless = _write(tmp_path / "serverless", {"c": {"certificate-authority": "ca"}},
                        {"u": {}}, {"x": ("c", "u")}, "x")
    with pytest.raises(KubeConfigError, match="cluster 'c' has no server"):
        await load_kubeconfig(str(serverless))


async def test_token_file_wins_over_token_and_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    path = _plain(tmp_path / "config", {"token": "inline", "tokenFile": str(token)})
    credentials = (await load_kubeconfig(str(path))).credentials
    assert await credentials.authorization() == {"Authorization": "Bearer one"}
    token.write_text("two")
    assert await credentials.authorization() == {"Authorization": "Bearer one"}  # cached
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_TTL_SECONDS", 0.0)
    assert await credentials.authorization() == {"Authorization": "Bearer two"}
    token.unlink()  # mid-rotation: the last good token stays
    assert await credentials.authorization() == {"Authorization": "Bearer two"}
    token.write_text("three")
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_TTL_SECONDS", 3600.0)
    credentials.expire()  # what a 401 does: read it again now
    assert await credentials.authorization() == {"Authorization": "Bearer three"}


async def test_basic_auth_and_impersonation_headers(tmp_path: Path) -> None:
    path = _plain(tmp_path / "config", {"username": "ada", "password": "pw", "as": "bob",
                                        "as-uid": "42", "as-groups": ["g1", "g2"]})
    assert await _auth(path) == {
        "Authorization": "Basic " + base64.b64encode(b"ada:pw").decode(),
        "Impersonate-User": "bob", "Impersonate-Uid": "42", "Impersonate-Group": "g1, g2"}


async def test_oidc_auth_provider_id_token_is_sent_while_valid(tmp_path: Path) -> None:
    def part(claims: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    id_token = f"{part({'alg': 'none'})}.{part({'exp': 32503680000})}.sig"  # year 3000
    path = _plain(tmp_path / "config", {"auth-provider": {"name": "oidc", "config": {
        "client-id": "sunkd", "idp-issuer-url": "https://idp.invalid", "id-token": id_token}}})
    endpoint = await load_kubeconfig(str(path))
    assert await endpoint.credentials.authorization() == {"Authorization": f"Bearer {id_token}"}
    assert endpoint.credentials.refreshable  # a 401 loads it again (refresh-token)


async def test_other_auth_providers_are_refused_with_the_way_out(tmp_path: Path) -> None:
    path = _plain(tmp_path / "config", {"auth-provider": {"name": "azure", "config": {}}})
    with pytest.raises(KubeConfigError, match=r"auth-provider 'azure' is not supported.*exec"):
        await load_kubeconfig(str(path))


def _plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "plugin.py"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _exec_user(script: Path, **extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script),
                     "args": ["--flag"], "env": [{"name": "PLUGIN_ENV", "value": "set"}],
                     "interactiveMode": "Never", **extra}}


async def test_exec_plugin_token_is_kept_until_it_expires_or_a_401(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = _plugin(tmp_path, f"""
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
with open({str(runs)!r}, "a") as f:
    f.write("x")
n = len(open({str(runs)!r}).read())
assert sys.argv[1:] == ["--flag"] and os.environ["PLUGIN_ENV"] == "set"
assert info["spec"]["interactive"] is False
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {{"token": f"t{{n}}",
                             "expirationTimestamp": "2999-01-01T00:00:00Z"}}}}))
""")
    path = _plain(tmp_path / "config", _exec_user(script))
    credentials = (await load_kubeconfig(str(path))).credentials
    assert credentials.refreshable
    assert await credentials.authorization() == {"Authorization": "Bearer t1"}
    assert await credentials.authorization() == {"Authorization": "Bearer t1"}
    credentials.expire()  # what a 401 does
    assert await credentials.authorization() == {"Authorization": "Bearer t2"}
    assert runs.read_text() == "xx"


def _answer(status: str) -> str:
    return ('info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])\n'
            'print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential", '
            f'"status": {status}}}))')


async def test_an_expired_exec_credential_is_fetched_again(tmp_path: Path) -> None:
    script = _plugin(tmp_path, _answer(
        '{"token": str(os.getpid()), "expirationTimestamp": "2000-01-01T00:00:00Z"}'))
    credentials = (await load_kubeconfig(str(_plain(tmp_path / "config",
                                                    _exec_user(script))))).credentials
    first = await credentials.authorization()
    assert first != await credentials.authorization()  # expired at once: run again


async def test_an_exec_credential_without_expiry_is_kept_until_a_401(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    script = _plugin(tmp_path, f"runs = {str(runs)!r}\nopen(runs, 'a').write('x')\n"
                     + _answer('{"token": "t" + str(len(open(runs).read()))}'))
    credentials = (await load_kubeconfig(str(_plain(tmp_path / "config",
                                                    _exec_user(script))))).credentials
    for _ in range(3):  # the library alone would run the plugin for every request
        assert await credentials.authorization() == {"Authorization": "Bearer t1"}
    credentials.expire()
    assert await credentials.authorization() == {"Authorization": "Bearer t2"}
    assert runs.read_text() == "xx"


@pytest.mark.parametrize(("body", "message"), [
    ("sys.stderr.write('no login'); sys.exit(3)", "process returned 3. no login"),
    ("print('not json')", "failed to decode process output"),
    (_answer('{"token": "t", "expirationTimestamp": "soon"}'), "Unable to parse datetime"),
    ("print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', "
     "'kind': 'ExecCredential', 'status': {'token': 't'}}))", "does not match"),
])
async def test_exec_plugin_failures_say_what_went_wrong(tmp_path: Path, body: str,
                                                        message: str) -> None:
    with pytest.raises(CredentialUnavailable, match=message) as failed:
        await load_kubeconfig(str(_plain(tmp_path / "config", _exec_user(
            _plugin(tmp_path, body)))))
    assert isinstance(failed.value, OSError)  # retried with backoff like a lost connection


async def test_exec_plugin_failing_later_is_retried_not_fatal(tmp_path: Path) -> None:
    fail = tmp_path / "fail"
    script = _plugin(tmp_path, f"""
import pathlib
if pathlib.Path({str(fail)!r}).exists():
    sys.exit("the identity provider is down")
""" + _answer('{"token": "t", "expirationTimestamp": "2000-01-01T00:00:00Z"}'))
    credentials = (await load_kubeconfig(str(_plain(tmp_path / "config",
                                                    _exec_user(script))))).credentials
    fail.touch()
    with pytest.raises(CredentialUnavailable, match="identity provider is down"):
        await credentials.authorization()
    fail.unlink()
    assert await credentials.authorization() == {"Authorization": "Bearer t"}


async def test_exec_plugin_is_bounded_in_time(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_SECONDS", 0.5)
    pid = tmp_path / "pid"
    script = _plugin(tmp_path, f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
                     "import time; time.sleep(60)")
    with pytest.raises(CredentialUnavailable, match=r"took more than 0.5 s \(exec plugin"):
        await load_kubeconfig(str(_plain(tmp_path / "config", _exec_user(script))))
    # The hung plugin is killed (the library would leave it running), and reaped.
    started = time.monotonic()
    while time.monotonic() - started < 10:
        try:
            os.kill(int(pid.read_text()), 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the plugin still runs")
    gc.collect()


async def test_exec_command_with_a_slash_is_relative_to_its_kubeconfig(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf" / "bin").mkdir(parents=True)
    script = _plugin(tmp_path / "conf" / "bin", _answer('{"token": "relative"}'))
    monkeypatch.chdir(tmp_path)  # not the kubeconfig's directory
    path = _plain(tmp_path / "conf" / "config",
                  _exec_user(Path("bin") / script.name))
    assert await _auth(path) == {"Authorization": "Bearer relative"}


async def test_exec_plugin_missing_or_interactive_is_refused(tmp_path: Path) -> None:
    missing = _plain(tmp_path / "config", _exec_user(tmp_path / "gone",
                                                     installHint="install gone-auth"))
    with pytest.raises(CredentialUnavailable, match=r"gone.*install gone-auth"):
        await _auth(missing)
    interactive = _plain(tmp_path / "config2", _exec_user(tmp_path / "x",
                                                          interactiveMode="Always"))
    with pytest.raises(KubeConfigError, match="a daemon has no terminal"):
        await load_kubeconfig(str(interactive))
    no_command = _plain(tmp_path / "config3", {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1"}})
    with pytest.raises(KubeConfigError, match="missing key 'command'") as failed:
        await load_kubeconfig(str(no_command))
    assert not isinstance(failed.value, CredentialUnavailable)  # fatal: fix the file


async def test_https_clusters_get_a_verifying_context(tmp_path: Path) -> None:
    ca = base64.b64encode(Path(certifi.where()).read_bytes()).decode()
    path = _write(tmp_path / "config", {
        "strict": {"server": "https://api:6443", "tls-server-name": "kubernetes",
                   "proxy-url": "http://proxy:3128"},
        "loose": {"server": "https://api:6443", "insecure-skip-tls-verify": True},
        "loose-ca": {"server": "https://api:6443", "insecure-skip-tls-verify": True,
                     "certificate-authority-data": ca},
        "bad-ca": {"server": "https://api:6443", "certificate-authority-data":
                   base64.b64encode(b"not a certificate").decode()},
    }, {"u": {}}, {"s": ("strict", "u"), "l": ("loose", "u"), "lc": ("loose-ca", "u"),
                   "b": ("bad-ca", "u")})
    strict = await load_kubeconfig(str(path), "s")
    assert strict.ssl_context is not None
    assert strict.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert strict.server_hostname == "kubernetes"
    assert strict.proxy == "http://proxy:3128"
    for name in ("l", "lc"):  # insecure-skip-tls-verify wins over a CA, as in client-go
        loose = (await load_kubeconfig(str(path), name)).ssl_context
        assert loose is not None and loose.verify_mode == ssl.CERT_NONE
    with pytest.raises(KubeConfigError, match="cannot load the certificate authority"):
        await load_kubeconfig(str(path), "b")


async def test_in_cluster_needs_the_service_and_its_token(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="not in a pod"):
        await in_cluster(str(tmp_path), env={})
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="token file does not exist"):
        await in_cluster(str(tmp_path), env=env)
    (tmp_path / "token").write_text("sa")
    (tmp_path / "ca.crt").write_text(json.dumps("no CA"))
    with pytest.raises(KubeConfigError, match="in-cluster CA"):
        await in_cluster(str(tmp_path), env=env)
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    assert (await in_cluster(str(tmp_path), env=env)).server == "https://[fd00::1]:443"


async def test_in_cluster_token_is_read_again_after_a_401(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound token rotates: the library re-reads it each minute, a 401 at once."""
    (tmp_path / "token").write_text("first\n")
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    credentials = (await in_cluster(str(tmp_path), env=env)).credentials
    assert await credentials.authorization() == {"Authorization": "Bearer first"}
    (tmp_path / "token").write_text("second\n")
    assert await credentials.authorization() == {"Authorization": "Bearer first"}  # cached
    assert credentials.refreshable
    credentials.expire()
    assert await credentials.authorization() == {"Authorization": "Bearer second"}
    # Without a 401: the library's hook reads it again once its minute is over.
    monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", datetime.timedelta(0))
    (tmp_path / "token").write_text("third\n")
    credentials.expire()  # ends the cached minute of "second"; "third" then lasts zero
    assert await credentials.authorization() == {"Authorization": "Bearer third"}
    (tmp_path / "token").write_text("fourth\n")
    assert await credentials.authorization() == {"Authorization": "Bearer fourth"}
