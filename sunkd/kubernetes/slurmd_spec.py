"""Nodeset `spec.slurmd` parsed into the domain's `SlurmdSpec`, with an error naming the field.

A Nodeset that asks sunkd to run slurmd pods must say exactly what to run: a wrong shape
here would otherwise surface as a pod the API server refuses, node after node. So every
field is checked when the Nodeset is read, and a bad one makes the whole Nodeset
malformed (`MalformedObject`, which the source reports and never folds): nothing half
parsed is acted on. Absent `spec.slurmd` is `None`: today's behaviour, no pods.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from sunkd.domain.events import Label, SlurmdSpec
from sunkd.kubernetes.slurmd_auth import check_with_spec, parse_auth
from sunkd.kubernetes.slurmd_template import parse_template
from sunkd.kubernetes.wire import MalformedObject

REGISTRATIONS = ("Static", "Dynamic")  # `slurmd -N <node>` | `slurmd -Z -N <node> --conf ...`
UPDATE_STRATEGIES = ("RollingUpdate", "OnDelete")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_GRACE_SECONDS = 86_400
# A label value (RFC 1123 label, at most 63 characters): the Nodeset's name is one on its pods.
MAX_LABEL_VALUE = 63
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PERCENT_OR_INT = re.compile(r"^(0|[1-9][0-9]{0,6})%?$")
# A `--conf` word: `Key=Value` (slurm.conf's node line syntax, slurmd(8)); no quotes or
# spaces (sunkd passes the words as one argument, no shell).
_CONF_WORD = re.compile(r"^([A-Za-z][A-Za-z0-9]*)=([^\s'\"]+)$")
# Node line keys slurmd refuses in --conf (`_validate_dynamic_conf` in
# src/slurmd/slurmd/slurmd.c): NodeName (sunkd gives the name with -N). Port is refused
# there too before 23.11, and taken after: left to the site's Slurm (docs/nodeset.md).
_CONF_REFUSED = ("nodename",)
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i?|[mkMGTPE])?$")

_KNOWN = frozenset({
    "image", "imagePullPolicy", "registration", "confServer", "conf", "args", "env",
    "resources", "volumes", "volumeMounts", "privileged", "priorityClassName",
    "terminationGracePeriodSeconds", "updateStrategy", "maxConcurrentStartup", "template",
    "auth",
})


def _where(field: str) -> str:
    return f"spec.slurmd.{field}"


def _text(raw: Mapping[str, Any], field: str, *, required: bool = False) -> str | None:
    value = raw.get(field)
    if value is None:
        if required:
            raise MalformedObject(_where(field), "missing")
        return None
    if not isinstance(value, str) or not value.strip():
        raise MalformedObject(_where(field), f"not a non-empty string: {value!r}")
    return value


def _choice(raw: Mapping[str, Any], field: str, options: tuple[str, ...], default: str,
            where: str | None = None) -> str:
    value = raw.get(field, default)
    if value not in options:
        raise MalformedObject(where or _where(field),
                              f"{value!r} is not one of {', '.join(options)}")
    return str(value)


def _count(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MalformedObject(where, f"not an integer from {low} to {high}: {value!r}")
    return value


def _env(raw: Any) -> tuple[Label, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedObject(_where("env"), "not a list")
    env = []
    for index, item in enumerate(raw):
        where = _where(f"env[{index}]")
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) \
                or not _ENV_NAME.match(item["name"]):
            raise MalformedObject(where, f"needs a valid name: {item!r}")
        if "valueFrom" in item:
            raise MalformedObject(where, "valueFrom is not supported yet; give value")
        value = item.get("value", "")
        if not isinstance(value, str):
            raise MalformedObject(where, f"value is not a string: {value!r}")
        env.append(Label(item["name"], value))
    return tuple(env)


def _quantities(raw: Any, where: str) -> tuple[Label, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise MalformedObject(where, "not a map of resource quantities")
    out = []
    for name, quantity in sorted(raw.items()):
        text = str(quantity) if isinstance(quantity, int) and not isinstance(quantity, bool) \
            else quantity
        if not isinstance(text, str) or not _QUANTITY.match(text):
            raise MalformedObject(f"{where}.{name}", f"not a quantity: {quantity!r}")
        out.append(Label(str(name), text))
    return tuple(out)


def _objects(raw: Any, field: str, required: tuple[str, ...]) -> tuple[str, ...]:
    """Kubernetes objects (Volume, VolumeMount) as canonical JSON text; each needs `name`
    (a DNS label) and the `required` fields."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedObject(_where(field), "not a list")
    texts = []
    for index, item in enumerate(raw):
        where = _where(f"{field}[{index}]")
        if not isinstance(item, Mapping):
            raise MalformedObject(where, "not an object")
        for key in required:
            if not isinstance(item.get(key), str) or not item[key]:
                raise MalformedObject(f"{where}.{key}", "missing")
        if not _DNS_LABEL.match(item["name"]) or len(item["name"]) > MAX_LABEL_VALUE:
            raise MalformedObject(f"{where}.name", f"not a DNS label: {item['name']!r}")
        texts.append(json.dumps(item, sort_keys=True, separators=(",", ":")))
    return tuple(texts)


def _args(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise MalformedObject(_where("args"), "not a list of strings")
    for arg in raw:
        if arg in ("-N", "-Z", "-D") or arg.startswith(("-N", "-Z")) \
                or arg.split("=", 1)[0] in ("--conf", "--conf-server"):
            raise MalformedObject(_where("args"), f"{arg!r} is sunkd's to set (registration, "
                                  "spec.slurmd.conf, spec.slurmd.confServer)")
    return tuple(raw)


def conf_words(conf: str | None, where: str = _where("conf")) -> list[tuple[str, str]]:
    """The `Key=Value` words of `spec.slurmd.conf`, in order. Raises `MalformedObject`."""
    words = []
    for word in (conf or "").split():
        found = _CONF_WORD.match(word)
        if found is None:
            raise MalformedObject(where, f"{word!r} is not a Key=Value node parameter")
        if found.group(1).lower() in _CONF_REFUSED:
            raise MalformedObject(where, f"{found.group(1)} is not allowed in slurmd --conf "
                                  "(slurmd(8)): sunkd names the node with -N")
        words.append((found.group(1), found.group(2)))
    return words


def parse_slurmd(raw: Any, nodeset_name: str) -> SlurmdSpec | None:
    """`spec.slurmd` of Nodeset `nodeset_name`; None when absent. Raises `MalformedObject`."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise MalformedObject("spec.slurmd", "not an object")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise MalformedObject("spec.slurmd", f"unknown field(s): {', '.join(unknown)}")
    if len(nodeset_name) > MAX_LABEL_VALUE or not _DNS_LABEL.match(nodeset_name):
        raise MalformedObject("metadata.name", "a Nodeset with spec.slurmd needs a name that "
                              f"is a DNS label (at most {MAX_LABEL_VALUE} characters): it "
                              "labels its pods")
    registration = _choice(raw, "registration", REGISTRATIONS, "Static")
    conf = _text(raw, "conf")
    if conf is not None and registration == "Static":
        raise MalformedObject(_where("conf"), "applies to Dynamic registration only "
                              "(slurmd takes --conf with -Z); a Static node is defined "
                              "in slurm.conf")
    conf_words(conf)
    if registration == "Dynamic" and raw.get("confServer") is None:
        raise MalformedObject(_where("confServer"), "required for Dynamic registration: a "
                              "dynamic node has no slurm.conf line, slurmd fetches the "
                              "configuration from slurmctld (configless)")
    resources = raw.get("resources")
    if resources is not None and not isinstance(resources, Mapping):
        raise MalformedObject(_where("resources"), "not an object")
    resources = resources or {}
    strategy = raw.get("updateStrategy") or {}
    if not isinstance(strategy, Mapping):
        raise MalformedObject(_where("updateStrategy"), "not an object")
    rolling = strategy.get("rollingUpdate") or {}
    if not isinstance(rolling, Mapping):
        raise MalformedObject(_where("updateStrategy.rollingUpdate"), "not an object")
    unavailable = str(rolling.get("maxUnavailable", "1"))
    if isinstance(rolling.get("maxUnavailable"), bool) or not _PERCENT_OR_INT.match(unavailable) \
            or unavailable in ("0", "0%"):
        raise MalformedObject(_where("updateStrategy.rollingUpdate.maxUnavailable"),
                              f"not a positive integer or percentage: {unavailable!r}")
    privileged = raw.get("privileged", True)
    if not isinstance(privileged, bool):
        raise MalformedObject(_where("privileged"), f"not a boolean: {privileged!r}")
    startup = raw.get("maxConcurrentStartup")
    env = _env(raw.get("env"))
    requests = _quantities(resources.get("requests"), _where("resources.requests"))
    limits = _quantities(resources.get("limits"), _where("resources.limits"))
    volumes = _objects(raw.get("volumes"), "volumes", ("name",))
    volume_mounts = _objects(raw.get("volumeMounts"), "volumeMounts", ("name", "mountPath"))
    template = parse_template(
        raw.get("template"), volumes={json.loads(v)["name"] for v in volumes},
        env={e.key for e in env}, mounts={json.loads(m)["mountPath"] for m in volume_mounts},
        resources={"requests": {q.key for q in requests}, "limits": {q.key for q in limits}})
    spec = SlurmdSpec(
        image=_text(raw, "image", required=True) or "",
        image_pull_policy=_choice(raw, "imagePullPolicy", PULL_POLICIES, "IfNotPresent"),
        registration=registration,
        conf_server=_text(raw, "confServer"),
        conf=conf,
        args=_args(raw.get("args")),
        env=env,
        requests=requests,
        limits=limits,
        volumes=volumes,
        volume_mounts=volume_mounts,
        privileged=privileged,
        priority_class_name=_text(raw, "priorityClassName") or "system-node-critical",
        termination_grace_seconds=_count(
            raw.get("terminationGracePeriodSeconds", 60),
            _where("terminationGracePeriodSeconds"), 0, MAX_GRACE_SECONDS),
        update_strategy=_choice(strategy, "type", UPDATE_STRATEGIES, "RollingUpdate",
                                _where("updateStrategy.type")),
        max_unavailable=unavailable,
        max_concurrent_startup=None if startup is None else _count(
            startup, _where("maxConcurrentStartup"), 1, 1_000_000),
        template=template,
        auth=parse_auth(raw.get("auth")),
    )
    check_with_spec(spec)  # its volumes, mounts and env beside what the auth renders
    return spec
