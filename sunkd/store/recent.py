"""The payloads this process appended lately, so that reading them back can share them.

Why: the state is a fold over the log, so the leader's engine reads back every event its
own sources appended and decodes a second copy of it. At 10,000 nodes and 100,000 pods
that second copy (every node's last observations, every pod's name and uid in the fold's
workload) was tens of megabytes of the daemon's RSS (docs/performance.md, "Scale").

`RecentAppends` remembers, for a bounded number of the newest seqs this `EventLog`
appended, the payload object it was given. A read still decodes every row; where the
decoded payload is *identical* to the remembered one (same types all the way down, same
values, see `identical`), the read hands out the remembered object instead, so the
fold and the sources hold one copy. Anything else (an evicted seq, another process's
append, a payload that does not survive encoding unchanged) keeps the decoded one. What
a reader gets is therefore always a value equal to what the log holds, exactly as a
standby or a restart reads it: the cache changes which object, never which value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from sunkd.domain.events import Payload

# A first sync at 10,000 nodes appends ~30,000 observations at once; the engine reads
# them back within a few batches. Older seqs simply decode as before.
RECENT_APPENDS = 50_000

_FIELDS: dict[type, tuple[str, ...]] = {}
_SCALARS = frozenset({str, int, bool, type(None)})


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def identical(a: Any, b: Any) -> bool:
    """Equal, and of the same types at every level. `1 == 1.0 == True` and a tuple equal to
    a list's contents are not enough here: the shared object must encode (in a snapshot)
    exactly as the decoded one would."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _SCALARS:
        return bool(a == b)
    if isinstance(a, float):
        return a.hex() == b.hex() if not math.isnan(a) else math.isnan(b)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(map(identical, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(identical(v, b[k]) for k, v in a.items())
    if dataclasses.is_dataclass(a):
        return all(identical(getattr(a, name), getattr(b, name))
                   for name in _field_names(type(a)))
    return bool(a == b)


class RecentAppends:
    """seq -> the payload appended under it, for the newest `limit` seqs."""

    def __init__(self, limit: int = RECENT_APPENDS) -> None:
        self.limit = limit
        self._payloads: dict[int, Payload] = {}  # insertion (= seq) order
        self.shared = 0  # reads that handed out the remembered object

    def __len__(self) -> int:
        return len(self._payloads)

    def remember(self, seqs: Iterable[int], payloads: Iterable[Payload]) -> None:
        if self.limit <= 0:
            return
        for seq, payload in zip(seqs, payloads, strict=True):
            self._payloads[seq] = payload
        excess = len(self._payloads) - self.limit
        if excess > 0:
            oldest = iter(self._payloads)
            for seq in [next(oldest) for _ in range(excess)]:
                del self._payloads[seq]

    def share(self, seq: int, decoded: Payload) -> Payload:
        """The remembered payload for `seq` if it is identical to `decoded`, else `decoded`.
        Either way `seq` is forgotten: one reader (the engine's fold) benefits, and a
        repeated read of old rows gets decoded objects as it always did."""
        remembered = self._payloads.pop(seq, None)
        if remembered is not None and identical(remembered, decoded):
            self.shared += 1
            return remembered
        return decoded
