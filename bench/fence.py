"""Benchmark: what the hook fence costs a job start, under a backlog of pending jobs.

Why: with `slurm.hook_fence` the PrologSlurmctld hook asks sunkd, for every job that
starts, whether each of its nodes is Slurm's in the current term (docs/slurm.md, "The
fence"), so sunkd sits in the path of every job start. slurmctld runs PrologSlurmctld
for each job before the job's tasks launch (slurm.conf(5)), so the hook's wall time is
start latency every job pays, and with a queue of pending jobs slurmctld starts jobs in
batches: the question is what the fence adds when many hooks run at once.

Same setup in both arms, one after the other in one run: a real private Slurm cluster
(the host's packages, 3 nodes), sunkd's daemon in-process on SQLite with hooks enabled,
the Kubernetes API emulator with a Nodeset over the nodes (all Slurm-owned), the hooks
chained as the test bed writes them. Each arm submits one array of `--jobs` short jobs
(`true`) at once, so that nearly all of them are pending while the first start, and
times:

* the prolog hook's wall time per job: a bench wrapper around the test bed's prolog
  wrapper marks the moment slurmctld started it and the moment it exited (what the job
  waits for; the hook's interpreter start, the chained site script, the POST, and in
  the fence arm sunkd's answer);
* the whole array's run (submit -> last job gone from the queue), the throughput a
  site sees;
* refused jobs (every node is Slurm's, so the fence must allow every one).

Same-run baseline: the arm without the fence (the hook still POSTs, as a site with
hooks and no fence runs it), run before and after the fence arm; the fence's cost is
measured against their mean. Target: the fence adds at most 50 ms to the hook's p99
and no job is refused.

Usage: python bench/fence.py [--quick] [--jobs N]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import _EmulatorKube, _pct
from sunkd_testbed.hooks import HookScripts

NODES = "fb[1-3]"


def wrap_prolog(hooks: HookScripts) -> Path:
    """Wrap the test bed's prolog wrapper so that each run leaves `timed.JOBID` with
    the moments slurmctld started it and it exited; returns the marks directory."""
    inner = hooks.dir / "prolog.sh"
    timed = hooks.dir / "prolog-inner.sh"
    inner.rename(timed)
    inner.write_text(
        "#!/bin/sh\n"
        "began=$(date +%s.%N)\n"
        f"{timed}\n"
        "rc=$?\n"
        f'echo "$began $(date +%s.%N) $rc" > {hooks.marks}/timed.$SLURM_JOB_ID\n'
        "exit $rc\n")
    inner.chmod(0o755)
    return hooks.marks


def hook_times(marks: Path, since: float) -> tuple[list[float], int]:
    """Per job: the prolog's wall time in ms; and how many exited non-zero."""
    walls: list[float] = []
    refused = 0
    for path in marks.glob("timed.*"):
        try:
            began, ended, rc = path.read_text().split()
        except (OSError, ValueError):
            continue
        if float(began) < since:
            continue
        walls.append((float(ended) - float(began)) * 1000)
        refused += rc != "0"
    return walls, refused


def queue_length(cluster: Any) -> int:
    # -r: an array's pending tasks one per line (else one line for all of them)
    out = cluster.run("squeue", "-h", "-r", "-o", "%i", check=False)
    return len([line for line in out.splitlines() if line.strip()])


async def arm(cluster: Any, hooks: HookScripts, marks: Path, fence: bool, jobs: int,
              within: float = 600.0) -> dict[str, Any]:
    from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
    from sunkd.runtime.daemon import Daemon
    from sunkd.slurm.client import SlurmRestClient
    from sunkd_testbed.demo import nodeset_object

    workdir = tempfile.TemporaryDirectory()
    kube = _EmulatorKube()
    count = len(cluster.node_names)
    await kube.start(list(cluster.node_names), nodeset_object(maxKubernetes=count))
    try:
        settings = replace(
            Settings(database_url=f"sqlite+aiosqlite:///{workdir.name}/sunkd.db",
                     listen="127.0.0.1:0"),
            slurm=SlurmSettings(url=cluster.rest_unix_url, poll_interval=5.0,
                                hook_token_file=hooks.token_file, hook_fence=fence),
            kubernetes=KubernetesSettings(namespace="sunkd"))
        client = SlurmRestClient.from_settings(settings.slurm)
        daemon = Daemon(settings, slurm_client=client, kube_client=kube.client,
                        slurm_env=cluster.env)
        task = asyncio.create_task(daemon.run())

        def slurm_owned() -> bool:
            nodes = daemon.state().nodes.values()
            return (daemon.http_port is not None and len(nodes) == count
                    and all(n.owner == "slurm" and n.transition is None for n in nodes))

        deadline = time.monotonic() + 60
        while not slurm_owned():
            if time.monotonic() > deadline:
                raise TimeoutError("the nodes did not settle as Slurm's")
            kube.step()
            await asyncio.sleep(0.05)
        hooks.configure(f"http://127.0.0.1:{daemon.http_port}", fence=fence)
        since = time.time()
        submitted = time.monotonic()
        cluster.sbatch("-n1", f"--array=0-{jobs - 1}", wrap="true", partition="gpu")
        peak = 0
        while True:
            kube.step()
            waiting = await asyncio.to_thread(queue_length, cluster)
            peak = max(peak, waiting)
            if waiting == 0:
                break
            if time.monotonic() - submitted > within:
                shown = cluster.run("squeue", "-o", "%i %T %r", check=False) + cluster.run(
                    "sinfo", "-N", "-o", "%N %T %E", check=False)
                raise TimeoutError(f"{waiting} jobs still queued after {within} s:\n{shown}")
            await asyncio.sleep(0.5)
        wall = time.monotonic() - submitted
        daemon.stop_event.set()
        await task
        await client.close()
    finally:
        await kube.stop()
        workdir.cleanup()
    walls, refused = hook_times(marks, since)
    return {"prolog_p50_ms": _pct(walls, 0.5), "prolog_p99_ms": _pct(walls, 0.99),
            "prologs": len(walls), "refused": refused, "array_wall_s": round(wall, 1),
            "jobs_per_s": round(jobs / wall, 1), "queue_peak": peak}


async def measure(jobs: int) -> dict[str, Any]:
    from sunkd_testbed.slurm import SlurmCluster

    hooks = HookScripts()
    marks = wrap_prolog(hooks)
    # The main scheduling loop every second (slurm.conf(5), SchedulerParameters
    # sched_interval, 60 s by default): the last tasks of an array otherwise wait up to a
    # minute on idle nodes, in both arms alike, and the array's time would measure that.
    cluster = SlurmCluster(NODES, partitions={"gpu": NODES},
                           extra_conf=[*hooks.conf_lines, "SchedulerParameters=sched_interval=1",
                                       # finished jobs leave slurmctld's memory (and
                                       # every GET /jobs) after 2 s, not 300: else each
                                       # arm would read the jobs of the arm before it
                                       "MinJobAge=2"])
    await asyncio.to_thread(cluster.start)
    figures: dict[str, Any] = {"jobs": jobs, "slurm": cluster.slurm_version or ""}
    try:
        # The baseline before and after the fence arm: the drift between the two is the
        # noise of this (shared) machine.
        for name, fence in (("no_fence", False), ("fence", True), ("no_fence_after", False)):
            result = await arm(cluster, hooks, marks, fence, jobs, within=max(60.0, jobs * 0.6))
            print(f"{name}: prolog p50 {result['prolog_p50_ms']} ms p99 "
                  f"{result['prolog_p99_ms']} ms over {result['prologs']} jobs, "
                  f"{result['refused']} refused; array {result['array_wall_s']} s "
                  f"({result['jobs_per_s']} jobs/s, queue peak {result['queue_peak']})",
                  file=sys.stderr)
            figures.update({f"{name}_{key}": value for key, value in result.items()})
    finally:
        await asyncio.to_thread(cluster.stop)
        hooks.cleanup()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 jobs per arm")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per arm (default 1000)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/fence.py starts a private Slurm cluster: run it as root", file=sys.stderr)
        return 2
    jobs = args.jobs or (50 if args.quick else 1000)
    figures: dict[str, Any] = {"load_average_1m": round(os.getloadavg()[0], 2)}
    figures.update(asyncio.run(measure(jobs)))
    baseline = (figures["no_fence_prolog_p99_ms"] + figures["no_fence_after_prolog_p99_ms"]) / 2
    added = round(figures["fence_prolog_p99_ms"] - baseline, 1)
    figures["fence_added_p99_ms"] = added
    targets = {"fence_added_p99_ms": {"value": added, "target": 50, "better": "lower"},
               "fence_refused": {"value": figures["fence_refused"], "target": 0,
                                 "better": "lower"}}
    print(json.dumps({"benchmark": "fence", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
