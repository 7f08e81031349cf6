"""Text for terminals. Reasons, pins and names come from outside (Slurm reasons, node
annotations, operators' `--reason`): printed as they are, an escape sequence in one of
them would drive the reader's terminal (clear the screen, hide lines, retitle the
window). `printable` shows such characters as escapes instead."""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, lone surrogates, and the bidirectional overrides and isolates
# that can make a line display in another order than it reads ("Trojan Source").
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """`str(value)` with control characters shown as `\\x1b`-style escapes."""
    text = str(value)
    if _UNPRINTABLE.search(text) is None:
        return text
    return _UNPRINTABLE.sub(_escape, text)


def shortened(value: object, limit: int = 80, *, quote: str = "") -> str:
    """`value` as `printable` shows it (between `quote`s), cut to `limit` characters with
    an ellipsis and its length when longer: an operator's typo of 10,000 characters is
    not echoed back."""
    text = str(value)
    if len(text) <= limit:
        return f"{quote}{printable(text)}{quote}"
    return f"{quote}{printable(text[:limit])}…{quote} ({len(text)} characters)"
