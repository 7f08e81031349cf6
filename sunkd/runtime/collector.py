"""Space CPython's cyclic collections out, and keep the loaded state out of them.

Why: CPython runs a young collection every 700 container allocations (`gc.get_threshold()`
is (700, 10, 10)), and whatever is alive at one moves up a generation. The daemon's
transient trees are big: a decoded 10,000-node `GET /nodes` body, a 500-Pod LIST page, a
page of decoded events, a snapshot being loaded. Caught alive, they are promoted to the
oldest generation, and when that has grown by a quarter CPython collects it: a scan of
every object the daemon holds, ~0.2-0.3 s at 10,000 nodes and 100,000 Pods. Measured with
`gc.callbacks` at that scale (bench/scale.py restart; docs/performance.md, "First sync and
restart after the collector changes"): 17-18 full collections, 3.0-4.2 s, before the
first decision of a start or a restart, six of them while the snapshot loaded; 2 with
these settings.

Two measures, both CPython's own knobs:
- `tune()`: a young collection every `YOUNG_THRESHOLD` allocations instead of 700, so a
  transient tree is mostly freed (by reference counting) before a collection can see it;
- `freeze()` after the state is loaded: `gc.freeze()` moves every object then alive to
  the permanent generation, which later collections do not scan. Frozen objects are still
  freed by reference counting when the fold replaces them; only a reference cycle among
  them would outlive its last reference, and the state and the caches have none.

Nothing changes for garbage without cycles (all of sunkd's data): reference counting frees
it at once, whatever the thresholds. Cycles (asyncio and aiohttp tracebacks, futures) wait
a few more allocations to be found.
"""

from __future__ import annotations

import gc

# Container allocations (net of frees) between two young collections. 50,000 is ~5 MB of
# small objects at most, well above one LIST page (~20,000 objects at 500 Pods) and one
# fold batch.
YOUNG_THRESHOLD = 50_000


def tune(young: int = YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Raise the young generation's threshold (the older two keep CPython's); returns
    the thresholds now in force."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
    return gc.get_threshold()


def freeze() -> int:
    """Move every object alive now out of the collector's scans; returns how many."""
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    return gc.get_freeze_count()
