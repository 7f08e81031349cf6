"""kubeconfig.py on files and plugin scripts (the wire is tests/integration/test_kube_config.py
and every real-plane test, whose kubeconfigs carry certificates or bound tokens)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import stat
import sys
from pathlib import Path
from typing import Any

import certifi
import pytest
import yaml

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
    return await load_kubeconfig(str(path), context).credentials.authorization()


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
    endpoint = load_kubeconfig(paths)
    assert endpoint.server == "http://first:1"  # current-context and names: first file
    assert await endpoint.credentials.authorization() == {"Authorization": "Bearer from-a"}
    other = load_kubeconfig(paths, "two")
    assert other.server == "http://other:2"
    assert await other.credentials.authorization() == {"Authorization": "Bearer from-b"}


def test_a_missing_context_cluster_or_user_says_which(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", {"c": {"server": "http://s:1"}}, {"u": {}},
                  {"x": ("c", "u"), "y": ("nope", "u"), "z": ("c", "ghost")})
    with pytest.raises(KubeConfigError, match="no current-context"):
        load_kubeconfig(str(path))
    with pytest.raises(KubeConfigError, match=r"no context named 'w' \(there are: x, y, z\)"):
        load_kubeconfig(str(path), "w")
    with pytest.raises(KubeConfigError, match="names cluster 'nope'"):
        load_kubeconfig(str(path), "y")
    with pytest.raises(KubeConfigError, match="names user 'ghost'"):
        load_kubeconfig(str(path), "z")
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="cannot read the kubeconfig"):
        load_kubeconfig(str(tmp_path / "broken"))


async def test_token_file_wins_over_token_and_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    path = _plain(tmp_path / "config", {"token": "inline", "tokenFile": str(token)})
    credentials = load_kubeconfig(str(path)).credentials
    assert await credentials.authorization() == {"Authorization": "Bearer one"}
    token.write_text("two")
    assert await credentials.authorization() == {"Authorization": "Bearer one"}  # cached
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_TTL_SECONDS", 0.0)
    assert await credentials.authorization() == {"Authorization": "Bearer two"}
    token.unlink()  # mid-rotation: the last good token stays
    assert await credentials.authorization() == {"Authorization": "Bearer two"}


async def test_basic_auth_and_impersonation_headers(tmp_path: Path) -> None:
    path = _plain(tmp_path / "config", {"username": "ada", "password": "pw", "as": "bob",
                                        "as-uid": "42", "as-groups": ["g1", "g2"]})
    assert await _auth(path) == {
        "Authorization": "Basic " + base64.b64encode(b"ada:pw").decode(),
        "Impersonate-User": "bob", "Impersonate-Uid": "42", "Impersonate-Group": "g1, g2"}


def test_auth_provider_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = _plain(tmp_path / "config", {"auth-provider": {"name": "gcp", "config": {}}})
    with pytest.raises(KubeConfigError, match=r"auth-provider 'gcp' is not supported.*exec"):
        load_kubeconfig(str(path))


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
    credentials = load_kubeconfig(str(path)).credentials
    assert credentials.refreshable
    assert await credentials.authorization() == {"Authorization": "Bearer t1"}
    assert await credentials.authorization() == {"Authorization": "Bearer t1"}
    credentials.expire()  # what a 401 does
    assert await credentials.authorization() == {"Authorization": "Bearer t2"}
    assert runs.read_text() == "xx"


async def test_an_expired_exec_credential_is_fetched_again(tmp_path: Path) -> None:
    script = _plugin(tmp_path, """
print(json.dumps({"kind": "ExecCredential", "status": {
    "token": str(os.getpid()), "expirationTimestamp": "2000-01-01T00:00:00Z"}}))
""")
    credentials = load_kubeconfig(str(_plain(tmp_path / "config",
                                             _exec_user(script)))).credentials
    first = await credentials.authorization()
    assert first != await credentials.authorization()  # expired at once: run again


@pytest.mark.parametrize(("body", "message"), [
    ("sys.stderr.write('no login'); sys.exit(3)", "exited with 3: no login"),
    ("print('not json')", "printed no ExecCredential JSON"),
    ("print(json.dumps({'status': {'clientCertificateData': 'x'}}))",
     "client certificate, which sunkd does not support"),
    ("print(json.dumps({'status': {'token': 't', 'expirationTimestamp': 'soon'}}))",
     "not RFC 3339"),
])
async def test_exec_plugin_failures_say_what_went_wrong(tmp_path: Path, body: str,
                                                        message: str) -> None:
    credentials = load_kubeconfig(str(_plain(tmp_path / "config", _exec_user(
        _plugin(tmp_path, body))))).credentials
    with pytest.raises(CredentialUnavailable, match=message) as failed:
        await credentials.authorization()
    assert isinstance(failed.value, OSError)  # retried with backoff like a lost connection


async def test_exec_plugin_missing_or_interactive_is_refused(tmp_path: Path) -> None:
    missing = _plain(tmp_path / "config", _exec_user(tmp_path / "gone",
                                                     installHint="install gone-auth"))
    with pytest.raises(KubeConfigError, match=r"gone.*install gone-auth"):
        await _auth(missing)
    interactive = _plain(tmp_path / "config2", _exec_user(tmp_path / "x",
                                                          interactiveMode="Always"))
    with pytest.raises(KubeConfigError, match="a daemon has no terminal"):
        load_kubeconfig(str(interactive))
    old = _plain(tmp_path / "config3", {"exec": {"apiVersion": "client.authentication.k8s.io/"
                                                 "v1alpha1", "command": "x"}})
    with pytest.raises(KubeConfigError, match="v1alpha1"):
        load_kubeconfig(str(old))


def test_https_clusters_get_a_verifying_context(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", {
        "strict": {"server": "https://api:6443", "tls-server-name": "kubernetes"},
        "loose": {"server": "https://api:6443", "insecure-skip-tls-verify": True},
        "bad-ca": {"server": "https://api:6443", "certificate-authority-data":
                   base64.b64encode(b"not a certificate").decode()},
    }, {"u": {}}, {"s": ("strict", "u"), "l": ("loose", "u"), "b": ("bad-ca", "u")})
    strict = load_kubeconfig(str(path), "s")
    assert strict.ssl_context is not None
    assert strict.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert strict.server_hostname == "kubernetes"
    loose = load_kubeconfig(str(path), "l").ssl_context
    assert loose is not None and loose.verify_mode == ssl.CERT_NONE
    with pytest.raises(KubeConfigError, match="cannot load the certificate authority"):
        load_kubeconfig(str(path), "b")


def test_in_cluster_needs_the_service_and_its_token(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="not in a pod"):
        in_cluster(str(tmp_path), env={})
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="cannot read the token file"):
        in_cluster(str(tmp_path), env=env)
    (tmp_path / "token").write_text("sa")
    (tmp_path / "ca.crt").write_text(json.dumps("no CA"))
    with pytest.raises(KubeConfigError, match="in-cluster CA"):
        in_cluster(str(tmp_path), env=env)
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    assert in_cluster(str(tmp_path), env=env).server == "https://[fd00::1]:443"
