"""One fact about JSON text both adapters need before they hand it to orjson.

Why: Slurm's and Kubernetes' clients decode their bodies with orjson first, which reads
an integer beyond 64 bits as a float (it is exact from -2**63 to 2**64 - 1), so a body
that may hold one goes through the stdlib instead, whose integers are exact at any size.
"May hold one" is a run of 19 digits or more. Pure: bytes in, a bool out.
"""

from __future__ import annotations

# Every ASCII digit mapped to "0" and everything else to " " (bytes.translate, one C
# pass), then a search for 19 zeros: ~12x faster than the regex [0-9]{19,}, which restarts
# at every digit of a run (0.76 s per 100,000 pods of LIST pages, more than orjson's
# decode of them; docs/performance.md, "Scale").
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_NINETEEN_DIGITS = b"0" * 19


def maybe_beyond_64_bits(data: bytes | bytearray) -> bool:
    """Whether `data` has a run of 19 or more ASCII digits."""
    return _NINETEEN_DIGITS in data.translate(_DIGITS_AS_ZERO)
