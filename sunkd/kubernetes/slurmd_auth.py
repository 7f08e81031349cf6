"""How a slurmd pod authenticates to Slurm: Nodeset `spec.slurmd.auth`, parsed and rendered.

slurmd signs and checks every message with the cluster's AuthType (slurm.conf(5)); a pod
whose slurmd cannot is never registered. Without `auth` (or `type: munge` without a key)
the site gives the pod munged's socket with its own volumes, as before. With a key Secret
sunkd renders what each plugin needs, checked against the plugin's own rules, because a
key file they refuse stops the pod with a message only its logs show:

- **munge** (auth/munge): a `munged --foreground` native sidecar (an init container with
  `restartPolicy: Always`, so the kubelet starts it, and waits for its startup probe,
  before slurmd) from the slurmd image or `mungeImage`, the socket in an emptyDir shared
  with slurmd. munged 0.5.15 (`_conf_open_keyfile` in src/munged/conf.c) refuses a key
  that is a symbolic link, not owned by munged's effective UID, or readable or writable by
  group or other; and (`path_is_secure` in src/munged/path.c) a key, socket, pid or seed
  directory, or any parent, that is owned by neither root nor that UID, or group/world
  writable without the sticky bit. So munged runs as root (UID 0: the Secret's file is
  root's, no chown step needed), the key is the Secret's file itself mounted with
  `subPath` (a Secret volume shows its keys as symbolic links into `..data`; a subPath
  mount is the file) at mode 0400 in a directory of its own, and munged's socket, pid,
  lock and seed files live in the emptyDir, which the kubelet creates with mode 0777:
  the sidecar makes it 0755 before it starts munged (the socket stays usable by every
  user: munged makes it 0777 and wants its directory searchable by all,
  `path_is_accessible`).
- **slurm** (auth/slurm, Slurm 23.11+; `CredType=cred/slurm` with it): no daemon, the key
  file. Slurm reads `SLURM_SACK_KEY`, else `slurm.key` next to slurm.conf (`init_internal`
  in src/plugins/auth/slurm/internal.c), follows symbolic links (stat), refuses a key
  with any permission for other (`_check_key_permissions`: "key file is insecure") and
  warns unless root or SlurmUser owns it. sunkd mounts the Secret's key read-only at
  `SLURM_KEY_PATH` (mode 0400, root's) and sets `SLURM_SACK_KEY` to it, so the site's
  slurm.conf directory (often a read-only ConfigMap) needs no file added.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import Any

from sunkd.domain.events import SlurmdAuth, SlurmdSpec
from sunkd.kubernetes.wire import MalformedObject

AUTH_TYPES = ("munge", "slurm")
MUNGED_CONTAINER = "munged"
MUNGE_KEY_DIR = "/etc/sunkd-munge"  # the key's own directory: root's, 0755 (runc makes it)
MUNGE_SOCKET = "munge.socket.2"  # munged's default socket name (AuthInfo=socket=DIR/this)
SLURM_KEY_DIR = "/etc/sunkd-slurm-key"
SLURM_KEY_PATH = f"{SLURM_KEY_DIR}/slurm.key"
SLURM_KEY_ENV = "SLURM_SACK_KEY"
KEY_MODE = 0o400
# Volume names sunkd adds to the pod; a site volume must not take them.
VOLUME_MUNGE_KEY = "sunkd-munge-key"
VOLUME_MUNGE_SOCKET = "sunkd-munge-socket"
VOLUME_SLURM_KEY = "sunkd-slurm-key"
RESERVED_VOLUMES = (VOLUME_MUNGE_KEY, VOLUME_MUNGE_SOCKET, VOLUME_SLURM_KEY)
DEFAULT_KEYS = {"munge": "munge.key", "slurm": "slurm.key"}
FIELDS = frozenset({"type", "keySecret", "mungeImage", "mungeSocketDir"})
# A Secret's name (DNS subdomain) and a key in it (`[-._a-zA-Z0-9]+`, core/v1 validation).
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# An absolute directory without shell or path tricks (it goes into the sidecar's script).
_DIRECTORY = re.compile(r"^(/[A-Za-z0-9_][A-Za-z0-9._-]*)+$")


def _where(field: str) -> str:
    return f"spec.slurmd.auth.{field}"


def parse_auth(raw: Any) -> SlurmdAuth | None:
    """`spec.slurmd.auth`; None when absent. Raises `MalformedObject` naming the field."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise MalformedObject("spec.slurmd.auth", "not an object")
    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise MalformedObject("spec.slurmd.auth", f"unknown field(s): {', '.join(unknown)}")
    kind = raw.get("type", "munge")
    if kind not in AUTH_TYPES:
        raise MalformedObject(_where("type"), f"{kind!r} is not one of {', '.join(AUTH_TYPES)}")
    secret, key = "", ""
    found = raw.get("keySecret")
    if found is not None:
        if not isinstance(found, Mapping) or set(found) - {"name", "key"}:
            raise MalformedObject(_where("keySecret"), "not an object of name and key")
        name, item = found.get("name"), found.get("key", DEFAULT_KEYS[kind])
        if not isinstance(name, str) or len(name) > 253 or not _SECRET_NAME.match(name):
            raise MalformedObject(_where("keySecret.name"), f"not a Secret name: {name!r}")
        if not isinstance(item, str) or len(item) > 253 or not _SECRET_KEY.match(item) \
                or item in (".", ".."):
            raise MalformedObject(_where("keySecret.key"), f"not a Secret key: {item!r}")
        secret, key = name, item
    elif kind == "slurm":
        raise MalformedObject(_where("keySecret"), "required for type slurm: auth/slurm's "
                              "slurmd needs the cluster's slurm.key")
    image = raw.get("mungeImage")
    socket_dir = raw.get("mungeSocketDir", "/run/munge")
    for field, value in (("mungeImage", image), ("mungeSocketDir", raw.get("mungeSocketDir"))):
        if value is None:
            continue
        if kind != "munge" or not secret:
            raise MalformedObject(_where(field), "applies only to type munge with keySecret "
                                  "(the munged sidecar sunkd runs)")
        if not isinstance(value, str) or not value.strip():
            raise MalformedObject(_where(field), f"not a non-empty string: {value!r}")
    if not isinstance(socket_dir, str) or not _DIRECTORY.match(socket_dir) \
            or "/../" in f"{socket_dir}/" or "/./" in f"{socket_dir}/":
        raise MalformedObject(_where("mungeSocketDir"),
                              f"not an absolute directory path: {socket_dir!r}")
    if f"{MUNGE_KEY_DIR}/".startswith(f"{socket_dir}/") \
            or socket_dir.startswith(f"{MUNGE_KEY_DIR}/"):
        raise MalformedObject(_where("mungeSocketDir"), f"{socket_dir} would hide the key's "
                              f"directory {MUNGE_KEY_DIR} or lie in it")
    return SlurmdAuth(type=kind, key_secret=secret, key_secret_key=key,
                      munge_image=image, munge_socket_dir=socket_dir)


def check_with_spec(spec: SlurmdSpec) -> None:
    """Refuse a spec whose own volumes, mounts or env would collide with what the auth
    renders (the API server would refuse the pod, or the site's value would be lost)."""
    auth = spec.auth
    for index, text in enumerate(spec.volumes):
        name = json.loads(text).get("name")
        if name in RESERVED_VOLUMES:
            raise MalformedObject(f"spec.slurmd.volumes[{index}].name",
                                  f"{name!r} is sunkd's (spec.slurmd.auth)")
    if auth is None or not auth.key_secret:
        return
    if auth.type == "munge":
        template = json.loads(spec.template) if spec.template else {}
        security = ((template.get("spec") or {}).get("securityContext") or {}) \
            if isinstance(template, Mapping) else {}
        if isinstance(security, Mapping) and security.get("fsGroup") is not None:
            # With fsGroup the kubelet adds group read to every file of a Secret volume
            # (`SetVolumeOwnership`, pkg/volume/volume_linux.go), and munged refuses a key
            # readable by its group.
            raise MalformedObject(
                "spec.slurmd.template.spec.securityContext.fsGroup",
                "makes the munge key group-readable, which munged refuses "
                "(spec.slurmd.auth.keySecret); remove fsGroup")
        for key in ("initContainers", "containers"):
            for index, item in enumerate((template.get("spec") or {}).get(key) or []):
                if isinstance(item, Mapping) and item.get("name") == MUNGED_CONTAINER:
                    raise MalformedObject(
                        f"spec.slurmd.template.spec.{key}[{index}].name",
                        f"{MUNGED_CONTAINER!r} is sunkd's munged sidecar "
                        "(spec.slurmd.auth.keySecret)")
        for index, text in enumerate(spec.volume_mounts):
            path = str(json.loads(text).get("mountPath") or "").rstrip("/")
            if path == auth.munge_socket_dir:
                raise MalformedObject(
                    f"spec.slurmd.volumeMounts[{index}].mountPath",
                    f"{path} is munged's socket directory, which sunkd's munged sidecar "
                    "provides (spec.slurmd.auth.keySecret); remove this mount")
    elif SLURM_KEY_ENV in (e.key for e in spec.env):
        raise MalformedObject("spec.slurmd.env", f"{SLURM_KEY_ENV} is sunkd's with "
                              "spec.slurmd.auth type slurm (the key from keySecret)")


def munged_script(socket_dir: str) -> str:
    """The sidecar's shell: the emptyDir to 0755 (munged refuses a world-writable
    directory without the sticky bit), then munged in the foreground (logs to stderr)."""
    quoted = shlex.quote(socket_dir)
    return (f"chmod 0755 {quoted} && exec munged --foreground"
            f" --key-file={MUNGE_KEY_DIR}/munge.key"
            f" --socket={quoted}/{MUNGE_SOCKET}"
            f" --pid-file={quoted}/munged.pid --seed-file={quoted}/munged.seed")


def render_auth(spec: SlurmdSpec, pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Add what `spec.auth` needs to the pod's spec and its slurmd container (in place)."""
    auth = spec.auth
    if auth is None or not auth.key_secret:
        return
    if auth.type == "munge":
        socket = {"name": VOLUME_MUNGE_SOCKET, "mountPath": auth.munge_socket_dir}
        pod_spec["volumes"] += [
            {"name": VOLUME_MUNGE_KEY,
             "secret": {"secretName": auth.key_secret, "defaultMode": KEY_MODE,
                        "items": [{"key": auth.key_secret_key, "path": "munge.key",
                                   "mode": KEY_MODE}]}},
            {"name": VOLUME_MUNGE_SOCKET, "emptyDir": {}},
        ]
        pod_spec["initContainers"] = [{
            "name": MUNGED_CONTAINER,
            "image": auth.munge_image or spec.image,
            "imagePullPolicy": spec.image_pull_policy,
            # A native sidecar (Kubernetes 1.29+): started before slurmd, runs beside it,
            # restarted if it exits, stopped after slurmd.
            "restartPolicy": "Always",
            "command": ["/bin/sh", "-c", munged_script(auth.munge_socket_dir)],
            "securityContext": {"runAsUser": 0, "runAsGroup": 0},
            "volumeMounts": [
                {"name": VOLUME_MUNGE_KEY, "mountPath": f"{MUNGE_KEY_DIR}/munge.key",
                 "subPath": "munge.key", "readOnly": True},
                socket,
            ],
            # slurmd starts once the socket exists: its first registration needs munged.
            "startupProbe": {
                "exec": {"command": ["test", "-S", f"{auth.munge_socket_dir}/{MUNGE_SOCKET}"]},
                "periodSeconds": 1, "failureThreshold": 120},
        }]
        container["volumeMounts"].append(dict(socket))
    else:
        pod_spec["volumes"].append(
            {"name": VOLUME_SLURM_KEY,
             "secret": {"secretName": auth.key_secret, "defaultMode": KEY_MODE,
                        "items": [{"key": auth.key_secret_key, "path": "slurm.key",
                                   "mode": KEY_MODE}]}})
        container["volumeMounts"].append(
            {"name": VOLUME_SLURM_KEY, "mountPath": SLURM_KEY_DIR, "readOnly": True})
        container["env"].append({"name": SLURM_KEY_ENV, "value": SLURM_KEY_PATH})
