"""Label and field selectors as the apiserver parses them.

Label selector grammar follows `k8s.io/apimachinery/pkg/labels/selector.go` (Parse):
`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>n`, `k<n`, joined by
commas. `!=` and `notin` also match objects that lack the key. Field selectors follow
`k8s.io/apimachinery/pkg/fields/selector.go`: comma-joined `f=v`, `f==v`, `f!=v` terms
with backslash escapes; which fields exist is per type (see `resources.py`).
`LabelSelector` objects (matchLabels + matchExpressions, used by PDBs and the Nodeset
CRD) follow `metav1.LabelSelectorAsSelector`: an empty selector matches everything,
a nil one matches nothing (callers decide which applies).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import KubeAPIError, bad_request

_KEY_RE = re.compile(r"[A-Za-z0-9_./-]+")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op in ("gt", "lt"):
            if not present:
                return False
            try:
                have, want = int(str(value)), int(self.values[0])
            except ValueError:
                return False
            return have > want if self.op == "gt" else have < want
        raise AssertionError(self.op)


class LabelSelector:
    """A parsed label selector string; `LabelSelector("")` matches everything."""

    def __init__(self, text: str | None) -> None:
        self.text = text or ""
        self.requirements = _parse_labels(self.text)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def _parse_labels(text: str) -> list[Requirement]:
    requirements: list[Requirement] = []
    pos = 0
    n = len(text)

    def skip_ws() -> None:
        nonlocal pos
        while pos < n and text[pos].isspace():
            pos += 1

    def read_key() -> str:
        nonlocal pos
        skip_ws()
        match = _KEY_RE.match(text, pos)
        if not match:
            raise bad_request(f"unable to parse requirement: found '{text[pos:pos + 1]}', "
                              f"expected: identifier")
        pos = match.end()
        return match.group(0)

    def read_value() -> str:
        nonlocal pos
        skip_ws()
        match = re.compile(r"[A-Za-z0-9_.-]*").match(text, pos)
        assert match is not None
        pos = match.end()
        return match.group(0)

    while True:
        skip_ws()
        if pos >= n:
            break
        negate = False
        if text[pos] == "!":
            negate = True
            pos += 1
        key = read_key()
        skip_ws()
        if negate:
            requirements.append(Requirement(key, "!"))
        elif pos >= n or text[pos] == ",":
            requirements.append(Requirement(key, "exists"))
        elif text.startswith("==", pos):
            pos += 2
            requirements.append(Requirement(key, "=", (read_value(),)))
        elif text.startswith("!=", pos):
            pos += 2
            requirements.append(Requirement(key, "!=", (read_value(),)))
        elif text[pos] == "=":
            pos += 1
            requirements.append(Requirement(key, "=", (read_value(),)))
        elif text[pos] in "<>":
            op = "gt" if text[pos] == ">" else "lt"
            pos += 1
            value = read_value()
            if not value.lstrip("-").isdigit():
                raise bad_request(f"unable to parse requirement: for 'gt', 'lt' operators, "
                                  f"the value must be an integer: {value}")
            requirements.append(Requirement(key, op, (value,)))
        else:
            word = re.compile(r"(notin|in)\b").match(text, pos)
            if not word:
                raise bad_request(f"unable to parse requirement: found '{text[pos:]}', "
                                  f"expected: in, notin, =, ==, !=, gt, lt")
            pos = word.end()
            skip_ws()
            if pos >= n or text[pos] != "(":
                raise bad_request("unable to parse requirement: found '', expected: '('")
            close = text.find(")", pos)
            if close < 0:
                raise bad_request("unable to parse requirement: found '', expected: ')'")
            values = tuple(v.strip() for v in text[pos + 1:close].split(",") if v.strip())
            pos = close + 1
            requirements.append(Requirement(key, word.group(1), values))
        skip_ws()
        if pos < n:
            if text[pos] != ",":
                raise bad_request(f"unable to parse requirement: found '{text[pos:]}', "
                                  f"expected: ','")
            pos += 1
    return requirements


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics. An empty `{}` selector matches everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists",
              "DoesNotExist": "!"}.get(str(expr.get("operator")))
        if op is None:
            return False
        req = Requirement(str(expr.get("key")), op, tuple(expr.get("values") or ()))
        if not req.matches(labels):
            return False
    return True


FieldGetter = Callable[[dict[str, Any]], dict[str, str]]


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negate: bool


class FieldSelector:
    """A parsed field selector; unknown fields are a 400, as in the apiserver."""

    def __init__(self, text: str | None, known: set[str]) -> None:
        self.text = text or ""
        self.terms: list[FieldTerm] = []
        for raw in _split_unescaped(self.text, ","):
            if not raw.strip():
                continue
            term = _parse_field_term(raw.strip())
            if term.field not in known:
                # k8s.io/apiserver conversion funcs: fmt.Errorf("field label not supported: %s")
                raise bad_request(f"field label not supported: {term.field}")
            self.terms.append(term)

    def matches(self, fields: Mapping[str, str]) -> bool:
        for term in self.terms:
            have = fields.get(term.field, "")
            if (have == term.value) == term.negate:
                return False
        return True

    def single_name(self) -> str | None:
        for term in self.terms:
            if term.field == "metadata.name" and not term.negate:
                return term.value
        return None


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _parse_field_term(raw: str) -> FieldTerm:
    for op, negate in (("!=", True), ("==", False), ("=", False)):
        index = raw.find(op)
        if index > 0:
            return FieldTerm(raw[:index].strip(), _unescape(raw[index + len(op):].strip()),
                             negate)
    raise bad_request(f"invalid selector: '{raw}'; can't understand '{raw}'")


__all__ = [
    "FieldSelector",
    "KubeAPIError",
    "LabelSelector",
    "Requirement",
    "label_selector_matches",
]
