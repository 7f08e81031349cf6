"""Credentials loaded by kubernetes-asyncio (sunkd/kubernetes/kubeconfig.py) against the
real API server: sunkd's ServiceAccount on bound tokens that the server revokes while sunkd
runs (a token file, and in a pod), an exec plugin rotating client certificates, and
`sunkd doctor` on sunkd's own token.

A bound token cannot be made to expire sooner than 10 minutes (TokenRequest's minimum
`expirationSeconds`), so expiry is had the other way the server ends a bound token
(`kube_backends.bound_token`, `revoke`). The daemon on rotating tokens is
test_e2e_real_kube.py.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sunkd.kubernetes import kubeconfig
from sunkd.kubernetes.client import LEASES, NODES, PODS, KubeClient
from sunkd.kubernetes.lease import LeaseElector
from sunkd_testbed.kubernetes import KubeControlPlane
from tests.integration.kube_backends import (
    SUNKD_NAMESPACE,
    bound_token,
    refused_as_unauthenticated,
    revoke,
    sunkd_plane,
    write_atomically,
)
from tests.integration.test_doctor_kubernetes import doctor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plane() -> Iterator[KubeControlPlane]:
    with sunkd_plane(scheduler=False, audit=True) as control_plane:
        yield control_plane


async def test_bound_token_rotations_through_a_token_file(
        plane: KubeControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sunkd on a `tokenFile` of its ServiceAccount's bound token: three times a new token
    is written and the old one revoked; the Lease elector (renewing, as the daemon's term
    does) and the LIST of Nodes keep working, each time through the 401 that makes sunkd
    read the file again (the minute's re-read is pushed out of the way)."""
    monkeypatch.setattr(kubeconfig, "TOKEN_FILE_TTL_SECONDS", 3600.0)
    token, secret = bound_token(plane)
    (tmp_path / "sa").mkdir()
    write_atomically(tmp_path / "sa" / "token", token)
    path = plane.write_kubeconfig(tmp_path / "sunkd.kubeconfig", token="unused")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"tokenFile": "sa/token"}  # relative to the kubeconfig
    path.write_text(yaml.safe_dump(config))
    client = await KubeClient.connect(str(path))
    elector = LeaseElector(client, namespace=SUNKD_NAMESPACE, name="rotation",
                           identity="sunkd-rotation", lease_duration=15, renew_deadline=10,
                           retry_period=2)
    try:
        assert client.endpoint.credentials.source == "token file sa/token"
        assert await elector.try_acquire_or_renew()
        refused = refused_as_unauthenticated(plane)
        for _ in range(3):
            new_token, new_secret = bound_token(plane)
            write_atomically(tmp_path / "sa" / "token", new_token)
            await revoke(plane, token, secret)
            assert await elector.try_acquire_or_renew()  # refused, file read, renewed
            nodes, _ = await client.list(NODES)
            assert isinstance(nodes, list)
            token, secret = new_token, new_secret
        await asyncio.sleep(0.5)  # the audit backend writes in batches
        assert refused_as_unauthenticated(plane) - refused >= 3  # one 401 per rotation
        lease = await client.get(LEASES, "rotation", SUNKD_NAMESPACE)
        assert lease["spec"]["holderIdentity"] == "sunkd-rotation"
        assert elector.transitions == lease["spec"].get("leaseTransitions", 0)
    finally:
        await elector.release()
        await client.close()


async def test_in_a_pod_the_rotated_service_account_token_is_read_again(
        plane: KubeControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-cluster configuration (the library's `InClusterConfigLoader`): the API server's
    address from KUBERNETES_SERVICE_HOST/PORT, the CA and the projected token from the
    service-account directory; after the kubelet swaps the token and the old one is
    revoked, the next request's 401 makes sunkd read it again."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    shutil.copy(plane.ca_file, sa / "ca.crt")
    token, secret = bound_token(plane)
    write_atomically(sa / "token", token)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(plane.apiserver_port))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    client = await KubeClient.connect(service_account_dir=str(sa))
    try:
        assert client.host == plane.url
        await client.list(PODS, namespace=SUNKD_NAMESPACE)
        for _ in range(2):
            new_token, new_secret = bound_token(plane)
            write_atomically(sa / "token", new_token)
            await revoke(plane, token, secret)
            await client.list(PODS, namespace=SUNKD_NAMESPACE)
            token, secret = new_token, new_secret
    finally:
        await client.close()


async def whoami(client: KubeClient) -> str:
    review = await client.request(
        "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


def short_lived_certificate(plane: KubeControlPlane, directory: Path, name: str,
                            seconds: int) -> datetime.datetime:
    """A client certificate for `name` (group system:masters) from the cluster's CA that
    expires `seconds` from now (`openssl ca`: `openssl x509` counts in days), written to
    `<directory>/<name>.crt` and `.key`; returns its notAfter."""
    directory.mkdir(exist_ok=True)
    (directory / "index.txt").touch()
    (directory / "serial").write_text("01\n")
    (directory / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n"
        "serial = serial\ndefault_md = sha256\npolicy = p\nunique_subject = no\n"
        "[p]\ncommonName = supplied\norganizationName = optional\n"
        "[ext]\nbasicConstraints = critical,CA:FALSE\n"
        "keyUsage = critical,digitalSignature\nextendedKeyUsage = clientAuth\n")
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    not_after = now + datetime.timedelta(seconds=seconds)
    stamp = "%y%m%d%H%M%SZ"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True,
                       timeout=30)

    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/O=system:masters/CN={name}")
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", str(plane.pki / "ca.crt"),
            "-keyfile", str(plane.pki / "ca.key"), "-in", f"{name}.csr",
            "-out", f"{name}.crt", "-notext", "-extensions", "ext",
            "-startdate", (now - datetime.timedelta(minutes=1)).strftime(stamp),
            "-enddate", not_after.strftime(stamp))
    return not_after


async def test_an_exec_plugin_rotates_the_client_certificate(
        plane: KubeControlPlane, tmp_path: Path) -> None:
    """An exec plugin that answers with a client certificate (the library writes it to a
    private file): first one that expires in a few seconds, then the admin's. The API
    server sees the first identity; once that certificate has expired it refuses it
    (401), sunkd runs the plugin again and goes on as the admin, over a new TLS context.
    (The library keeps no expirationTimestamp for a certificate answer: the 401 is what
    rotates it.)"""
    runs = tmp_path / "runs"
    certs = tmp_path / "certs"
    not_after = short_lived_certificate(plane, certs, "sunkd-soon", seconds=8)
    shutil.copy(plane.pki / "admin.crt", certs / "admin.crt")
    shutil.copy(plane.pki / "admin.key", certs / "admin.key")
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"""#!{sys.executable}
import json, os
with open({str(runs)!r}, "a") as f:
    f.write("x")
name = "sunkd-soon" if len(open({str(runs)!r}).read()) == 1 else "admin"
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": {{
    "clientCertificateData": open(f"{certs}/{{name}}.crt").read(),
    "clientKeyData": open(f"{certs}/{{name}}.key").read()}}}}))
""")
    plugin.chmod(0o700)
    path = plane.write_kubeconfig(tmp_path / "exec.kubeconfig", token="unused")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
        "interactiveMode": "IfAvailable"}}
    path.write_text(yaml.safe_dump(config))
    client = await KubeClient.connect(str(path))
    try:
        first_context = client.endpoint.ssl_context
        assert await whoami(client) == "sunkd-soon"
        wait = (not_after - datetime.datetime.now(datetime.UTC)).total_seconds() + 1.5
        await asyncio.sleep(max(wait, 0))
        assert await whoami(client) == "kubernetes-admin"
        assert client.endpoint.ssl_context is not first_context
        assert await whoami(client) == "kubernetes-admin"
        assert runs.read_text() == "xx"
    finally:
        await client.close()


async def test_doctor_on_sunkds_bound_token(plane: KubeControlPlane, tmp_path: Path) -> None:
    token, _ = bound_token(plane)
    kubeconfig_path = plane.write_kubeconfig(tmp_path / "sunkd.kubeconfig", token=token)
    code, report = await doctor(tmp_path, kubeconfig_path)
    kube = report["kubernetes"]
    assert isinstance(kube, dict), report
    assert code == 2 and kube["auth"] == "token" and kube["version"].startswith("v1.37")
    assert kube["nodesets"] == 0  # the CRD is installed; sunkd may list Nodesets
