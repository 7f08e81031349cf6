#!/usr/bin/env python3
"""Run every benchmark in bench/ with `--quick` once, as a smoke test (`make bench-smoke`,
part of `make test`).

Why: benchmarks are not tests, so nothing else runs them, and one that no longer runs
goes unnoticed until someone needs its figures. This checks the conventions every
benchmark keeps (docs/performance.md): it accepts `--quick`, exits 0, and prints as its
last line one JSON object `{"benchmark": NAME, "figures": {...}, "targets": {...}}`.
It checks that they run, not their figures: a target missed on a loaded CI machine is a
figure to read, not a failure. A module without a `__main__` block (bench/real_kube.py,
imported by bench/scale.py) is not a benchmark and is skipped.

Prints per benchmark its wall time and result, then its JSON line (the figures, for the
CI log), and exits 1 if any failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Far above the conventions' 60 s for `--quick`: this catches a hang, not slowness.
TIMEOUT_SECONDS = 600


def benchmarks() -> list[Path]:
    return [path for path in sorted((ROOT / "bench").glob("*.py"))
            if 'if __name__ == "__main__":' in path.read_text()]


def check_last_line(stdout: str) -> str | None:
    """Why the output breaks the convention, or None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return "printed nothing on stdout"
    try:
        report = json.loads(lines[-1])
    except ValueError as error:
        return f"last line is not JSON ({error}): {lines[-1][:200]!r}"
    if not isinstance(report, dict):
        return f"last line is not a JSON object: {lines[-1][:200]!r}"
    problems = []
    if not isinstance(report.get("benchmark"), str) or not report["benchmark"]:
        problems.append("no \"benchmark\" name")
    for key in ("figures", "targets"):
        if not isinstance(report.get(key), dict):
            problems.append(f"no {key!r} object")
    return "; ".join(problems) or None


def main() -> int:
    failed = []
    total = 0.0
    last = ""
    for path in benchmarks():
        name = path.relative_to(ROOT)
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, str(path), "--quick"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            seconds = time.monotonic() - started
            why: str | None = f"still running after {TIMEOUT_SECONDS} s"
            stderr = ""
        else:
            seconds = time.monotonic() - started
            why = (f"exit status {done.returncode}" if done.returncode != 0
                   else check_last_line(done.stdout))
            stderr = done.stderr
            if why is None:
                last = done.stdout.strip().splitlines()[-1]
        total += seconds
        print(f"{name}: {seconds:.1f} s, {'ok' if why is None else 'FAILED: ' + why}",
              flush=True)
        if why is None:
            print(f"  {last}", flush=True)
        else:
            failed.append(str(name))
            tail = stderr.strip().splitlines()[-20:]
            if tail:
                print("  stderr (last lines):\n    " + "\n    ".join(tail), flush=True)
    print(f"bench-smoke: {total:.0f} s in all; "
          + (f"failed: {', '.join(failed)}" if failed else "every benchmark ran"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
