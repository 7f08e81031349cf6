"""Benchmark: Slurm -> Kubernetes reaction with Slurm hooks vs polling, on real Slurm.

Why: polling slurmrestd makes every Slurm-side change wait for the next poll (about one
poll interval at p99); slurmctld's PrologSlurmctld/EpilogSlurmctld running `sunkd hook`
(docs/slurm.md, "Hooks") should take that to well under 100 ms. Same setup in both
arms, one after the other in one run: a real private Slurm cluster, sunkd's daemon
in-process on SQLite, the Kubernetes API emulator with the demo's scheduler stand-in,
Slurm polled every `--poll` seconds; the hooks arm also has the hooks in slurm.conf (run
as SlurmUser with the system python3, or the root's).

`--slurm VERSION` picks the generation (`sunkd_testbed.slurm.SLURM_VERSIONS`; default the
host's packages, 22.05 on Debian 12). Another one runs from the Debian root
`scripts/prepare-slurm-root.sh` made (cached under /var/cache/sunkd), as the tests run it
(`HookScripts.for_slurm`): slurmctld inside the root runs the hooks as the root's
SlurmUser with the root's python3, and, 24.05 and later taking several lines, the site's
scripts and the hook's on `PrologSlurmctld=`/`EpilogSlurmctld=` lines of their own. Then
the site script runs before the hook's line: its mark (the moment below) comes before
slurmctld starts the hook, so the figure also holds the hook's start (`hook_start_ms`),
which on 22.05's one chained line comes before the mark. `--chain` uses the one chained
line on any generation (like for like with 22.05). The JSON names the release
(`slurm`), where it ran from (`slurm_from`) and the form (`hook_lines`).

Per cycle, two reactions, each timed from Slurm's moment to the Kubernetes-side action's
`action.succeeded` (its time in the log). Slurm's moment is taken by the site scripts
(`sunkd_testbed.hooks`; chained by the hook, or on lines of their own before it), which
run in both arms: the start of the first job (its PrologSlurmctld), or the end of the
cancelled one (its EpilogSlurmctld):

* start -> taint: a node is lent to Kubernetes (a pending pool pod); then a job array
  needing every node is submitted. The tasks that start at once run PrologSlurmctld;
  its read brings the pending task in, and the lent node is reclaimed: its owner taint
  (`kubernetes/lock`) is the reaction.
* end -> lend step: every node runs a job and a pool pod is pending; one job is
  cancelled. EpilogSlurmctld plus the confirm reads see the node free, and the lend's
  next step on that node (its first action since the scancel) is the reaction.

Also the hook's start time (`sunkd-hook` with the python3 slurmctld runs it with, sunkd
unreachable: the cost Slurm pays per job and hook; in a root both it and `python3 -c
pass` run through `chroot ROOT env -i`, whose execs they both pay). Target: the hooks
arm's p99 over both reactions below 100 ms. `--quick` runs 1 cycle per arm at 1 s polls.

`--trace` times each step of the hooks arm's reactions (bench/hooktrace.py) and prints
the breakdown; `--hooks-only` skips the polling arm.

Usage: python bench/hooks.py [--quick] [--cycles N] [--poll S] [--trace] [--hooks-only]
       [--slurm 22.05|24.11|26.05] [--chain].
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import _EmulatorKube, _pct
from bench.hooktrace import Trace, dump, table
from sunkd.slurm.client import FIRST_WRITABLE_VERSION
from sunkd.slurm.normalize import version_tuple
from sunkd_testbed.hooks import HOOK, PYTHON, HookScripts
from sunkd_testbed.slurm import SLURM_VERSIONS, SlurmCluster, available

NODES = "hb[1-3]"


# A hook run that cannot reach sunkd (it fails open), with what Slurm puts in its environment.
HOOK_ENV = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "hb1",
            "SUNKD_HOOK_URL": "http://127.0.0.1:9", "SUNKD_HOOK_TOKEN_FILE": "/dev/null",
            "SUNKD_HOOK_CONFIG": "/nonexistent"}


def _median_ms(run: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def python_start_ms(runs: int) -> float:
    """Median wall time of `python3 -c pass`: the floor under the hook's start."""
    return _median_ms(partial(subprocess.run, [PYTHON, "-c", "pass"], check=True,
                              capture_output=True), runs)


def hook_start_ms(runs: int) -> float:
    """Median wall time of one hook run that cannot reach sunkd (fail-open), as the
    testbed's wrappers run it (`python3 -I -S .../sunkd/slurm/hook.py`)."""
    return _median_ms(partial(subprocess.run, [PYTHON, "-I", "-S", str(HOOK), "prolog-slurmctld"],
                              env={"PATH": "/usr/bin:/bin", **HOOK_ENV}, check=True,
                              capture_output=True), runs)


def start_times(runs: int, cluster: SlurmCluster, hooks: HookScripts) -> dict[str, Any]:
    """`hook_start_ms`, `python_start_ms` and the python3's version, with the python3
    slurmctld runs the hook with: the host's, or the root's (inside it, through the
    cluster's `chroot ROOT env -i`, with the hook's copy in the cluster's directory)."""
    version = "import sys; print(sys.version.split()[0])"
    if cluster.root is None:
        return {"hook_start_ms": hook_start_ms(runs), "python_start_ms": python_start_ms(runs),
                "hook_python": subprocess.run([PYTHON, "-c", version], check=True,
                                              capture_output=True, text=True).stdout.strip()}
    # The cluster runs `env -i NAME=VALUE ... CMD` in the root: these are more NAME=VALUEs.
    hook = [*(f"{k}={v}" for k, v in HOOK_ENV.items()), hooks.python, "-I", "-S",
            str(hooks.hook), "prolog-slurmctld"]
    return {"hook_start_ms": _median_ms(partial(cluster.run, *hook), runs),
            "python_start_ms": _median_ms(partial(cluster.run, hooks.python, "-c", "pass"),
                                          runs),
            "hook_python": cluster.run(hooks.python, "-c", version).strip()}


async def arm(cluster: Any, hooks: HookScripts, use_hooks: bool, cycles: int, poll: float,
              trace: Trace | None = None) -> tuple[list[float], list[float]]:
    from sunkd.runtime.config import KubernetesSettings, Settings, SlurmSettings
    from sunkd.runtime.daemon import Daemon
    from sunkd.slurm.client import SlurmRestClient
    from sunkd_testbed.demo import nodeset_object, pod_object

    for name in cluster.node_names:
        cluster.scontrol("update", f"nodename={name}", "state=resume", check=False)
    workdir = tempfile.TemporaryDirectory()
    kube = _EmulatorKube()
    count = len(cluster.node_names)
    await kube.start(list(cluster.node_names), nodeset_object(
        maxKubernetes=count, dwellSeconds=0.0, maxInFlight=count, drainTimeoutSeconds=60,
        reclaimGraceSeconds=0))
    starts: list[float] = []
    ends: list[float] = []
    commands: list[float] = []  # how long sbatch/scancel took (not in the reactions)
    try:
        settings = replace(
            Settings(database_url=f"sqlite+aiosqlite:///{workdir.name}/sunkd.db",
                     listen="127.0.0.1:0"),
            slurm=SlurmSettings(**rest_access(cluster), poll_interval=poll,
                                hook_token_file=hooks.token_file if use_hooks else None),
            kubernetes=KubernetesSettings(namespace="sunkd"))
        client = SlurmRestClient.from_settings(settings.slurm)
        daemon = Daemon(settings, slurm_client=client, kube_client=kube.client,
                        slurm_env=cluster.env)
        task = asyncio.create_task(daemon.run())

        def owners() -> dict[str, str]:
            return {n.name: n.owner for n in daemon.state().nodes.values()
                    if n.transition is None}

        def outcome_after(node: str | None, verbs: tuple[str, ...], moment: float
                          ) -> float | None:
            for state in daemon.state().nodes.values():
                if node is not None and state.name != node:
                    continue
                for verb, outcome in state.outcomes.items():
                    if (verbs == () or verb in verbs) and outcome.succeeded \
                            and outcome.at >= moment:
                        return outcome.at
            return None

        async def until(predicate: Callable[[], Any], within: float = 60.0) -> Any:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                kube.step()
                value = predicate()
                if value:
                    return value
                await asyncio.sleep(0.005)
            raise TimeoutError(f"no reaction within {within} s")

        await until(lambda: daemon.http_port is not None and len(owners()) == count
                    and set(owners().values()) == {"slurm"})
        # Without hooks in sunkd the hooks still run (and fail open): the site scripts
        # they chain record Slurm's moments for both arms alike.
        hooks.configure(f"http://127.0.0.1:{daemon.http_port}" if use_hooks
                        else "http://127.0.0.1:9")
        for cycle in range(cycles):
            # Start -> taint: reclaim the lent node for jobs that need every node.
            await kube.create_pod(pod_object(f"lend-{cycle}"))
            await until(lambda: "kubernetes" in owners().values())
            await asyncio.sleep(0.3)  # settled, and the Slurm side quiet
            # One array: its tasks queue together, so the prologs of those that start
            # at once run with the pending one already queued (slurmctld has no hook
            # for a submission).
            before = time.time()
            array = cluster.sbatch("-N1", "--exclusive", f"--array=0-{count - 1}",
                                   wrap="sleep 600", partition="gpu")
            started = time.time()
            done = await until(partial(outcome_after, None, ("kubernetes/lock",), before))
            first = min(hooks.started_since(before), default=started)
            starts.append((done - first) * 1000)
            if trace is not None:
                _trace_start(trace, hooks, first, done)
            commands.append((started - before) * 1000)
            await until(lambda: set(owners().values()) == {"slurm"} and len(owners()) == count
                        and all((s := nodes_now(daemon, n)) is not None and s.jobs == 1
                                for n in cluster.node_names))
            # End -> lend step: a pool pod waits, a job ends.
            await kube.create_pod(pod_object(f"end-{cycle}"))
            await asyncio.sleep(1.0)  # the policy picks (and may drain) a busy node
            moving = [n.name for n in daemon.state().nodes.values()
                      if n.transition is not None and n.transition.to_owner == "kubernetes"]
            node = moving[0] if moving else cluster.node_names[0]
            element, job = _job_on(cluster, node)
            before = time.time()
            cluster.run("scancel", element)
            ended = time.time()
            done = await until(partial(outcome_after, node, (), before))
            end = await until(partial(hooks.moment, "end", job))
            ends.append((done - end) * 1000)
            if trace is not None:
                _trace_end(trace, hooks, job, end, done)
            commands.append((ended - before) * 1000)
            # Back to the start: every job gone, every pod gone, every node Slurm's.
            await until(lambda: "kubernetes" in owners().values())
            cluster.scancel(array)
            await kube.delete_pod(f"lend-{cycle}")
            await kube.delete_pod(f"end-{cycle}")
            # Demand that lasts until the lent node is back (a short job would leave first).
            back = cluster.sbatch("-N1", "--exclusive", f"--array=0-{count - 1}",
                                  wrap="sleep 600", partition="gpu")
            await until(lambda: set(owners().values()) == {"slurm"} and len(owners()) == count,
                        within=120)
            cluster.scancel(back)
            await until(lambda: all((s := nodes_now(daemon, n)) is not None and s.jobs == 0
                                    and s.state == "IDLE" for n in cluster.node_names),
                        within=120)
        daemon.stop_event.set()
        await task
        await client.close()
    finally:
        await kube.stop()
        workdir.cleanup()
    print(f"  sbatch/scancel took {_pct(commands, 0.5)} ms (p50), {_pct(commands, 0.99)} ms "
          "(p99), not in the reactions", file=sys.stderr)
    return starts, ends


def rest_access(cluster: SlurmCluster) -> dict[str, Any]:
    """How sunkd reaches slurmrestd: the unix socket (rest_auth/local) where it writes nodes
    with scontrol (22.05), JWT over TCP where it writes them over REST (v0.0.39+: 24.11,
    26.05). There slurmrestd runs as an unprivileged user, and with rest_auth/local it
    would update nodes as that user, which slurmctld refuses ("Invalid user id")."""
    if version_tuple(cluster.rest_version or "v0.0.0") >= version_tuple(FIRST_WRITABLE_VERSION):
        return {"url": cluster.rest_url, "jwt_key_file": cluster.jwt_key_path}
    return {"url": cluster.rest_unix_url}


def _trace_start(trace: Trace, hooks: HookScripts, first: float, done: float) -> None:
    jobs = [p.name.split(".", 1)[1] for p in hooks.marks.glob("start.*")]
    job = next((j for j in jobs if hooks.moment("start", j) == first), None)
    steps = trace.steps(_wrapper_start(hooks, "prolog", job), first, done)
    if os.environ.get("SUNKD_BENCH_DUMP"):
        print("\n".join(["start reaction:", *dump(trace.records, first, done)]),
              file=sys.stderr)
    if steps is not None:
        trace.starts.append(steps)


def _trace_end(trace: Trace, hooks: HookScripts, job: int, end: float, done: float) -> None:
    steps = trace.steps(_wrapper_start(hooks, "epilog", job), end, done)
    if os.environ.get("SUNKD_BENCH_DUMP"):
        print("\n".join(["end reaction:", *dump(trace.records, end, done)]), file=sys.stderr)
    if steps is not None:
        trace.ends.append(steps)


def _wrapper_start(hooks: HookScripts, kind: str, job: int | str | None) -> float | None:
    """When slurmctld started the hook's wrapper, where that is before the moment (the
    chained form: the hook runs the site script). On lines of their own the site script
    runs first, and the trace's `hook -> sent` holds the hook's whole start."""
    return hooks.moment(kind, job) if hooks.chain and job is not None else None


def nodes_now(daemon: Any, name: str) -> Any:
    node = daemon.state().nodes.get(name)
    return node.slurm if node is not None else None


def _job_on(cluster: Any, node: str) -> tuple[str, int]:
    """The array task running on `node`: as `ARRAY_TASK` (22.05's scancel answers
    "Invalid job id specified" to the task's own job id) and its job id."""
    out = cluster.run("squeue", "-h", "-t", "R", "-w", node, "-o", "%i %A")
    task, job = out.split()[:2]
    return task, int(job)


async def measure(cycles: int, poll: float, traced: bool = False, hooks_only: bool = False,
                  version: str | None = None, chain: bool | None = None, runs: int = 20
                  ) -> dict[str, Any]:
    """Both arms on one cluster of Slurm `version` (None: the host's packages); `chain`:
    the hooks' slurm.conf form (`HookScripts.for_slurm`)."""
    base = Path(tempfile.mkdtemp(prefix="sunkd-slurm-"))
    hooks = HookScripts.for_slurm(version, base, chain=chain)
    figures: dict[str, Any] = {"cycles": cycles, "poll_interval_s": poll}
    cluster = SlurmCluster(NODES, partitions={"gpu": NODES}, extra_conf=hooks.conf_lines,
                           version=version, base_dir=base)
    try:
        await asyncio.to_thread(cluster.start)
    except BaseException:
        hooks.cleanup()
        shutil.rmtree(base, ignore_errors=True)
        raise
    runtime = cluster.runtime
    figures["slurm"] = cluster.slurm_version or (runtime.release if runtime else None) or ""
    figures["slurm_from"] = f"Debian {runtime.suite} root" if runtime and runtime.root \
        else "host packages"
    figures["hook_lines"] = "chained" if hooks.chain else "separate"
    figures["slurm_rest"] = (f"{cluster.rest_version}, "
                             + ("JWT over TCP" if "jwt_key_file" in rest_access(cluster)
                                else "unix socket, rest_auth/local"))
    try:
        figures.update(await asyncio.to_thread(start_times, runs, cluster, hooks))
        print(f"Slurm {figures['slurm']} ({figures['slurm_from']}, hooks on "
              f"{figures['hook_lines']} slurm.conf lines); sunkd-hook start (python3 "
              f"{figures['hook_python']}, fail-open): {figures['hook_start_ms']} ms; python3 "
              f"-c pass: {figures['python_start_ms']} ms", file=sys.stderr)
        for name, use_hooks in (("poll", False), ("hooks", True)):
            if hooks_only and not use_hooks:
                continue
            trace = Trace() if traced and use_hooks else None
            if trace is not None:
                trace.install()
            try:
                starts, ends = await arm(cluster, hooks, use_hooks, cycles, poll, trace)
            finally:
                if trace is not None:
                    trace.uninstall()
            if trace is not None:
                figures["trace"] = {"start_to_taint": table(trace.starts),
                                    "end_to_lend_step": table(trace.ends)}
                for kind, rows in figures["trace"].items():
                    print(f"trace {kind} ({len(trace.starts if kind[0] == 's' else trace.ends)}"
                          " reactions):", file=sys.stderr)
                    for row in rows:
                        print(f"  {row['step']:<40} median {row['median_ms']:>7} ms  max "
                              f"{row['max_ms']:>7} ms  {row['what']}", file=sys.stderr)
            both = starts + ends
            print(f"{name}: start->taint p50 {_pct(starts, 0.5)} ms p99 {_pct(starts, 0.99)} "
                  f"ms; end->lend step p50 {_pct(ends, 0.5)} ms p99 {_pct(ends, 0.99)} ms",
                  file=sys.stderr)
            figures.update({
                f"{name}_start_to_taint_p50_ms": _pct(starts, 0.5),
                f"{name}_start_to_taint_p99_ms": _pct(starts, 0.99),
                f"{name}_end_to_lend_step_p50_ms": _pct(ends, 0.5),
                f"{name}_end_to_lend_step_p99_ms": _pct(ends, 0.99),
                f"{name}_slurm_to_k8s_p99_ms": _pct(both, 0.99),
            })
    finally:
        await asyncio.to_thread(cluster.stop)
        hooks.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 cycle per arm, 1 s polls")
    parser.add_argument("--cycles", type=int, default=None)
    parser.add_argument("--poll", type=float, default=None, help="seconds (default 5)")
    parser.add_argument("--trace", action="store_true",
                        help="time each step of the hooks arm's reactions (bench/hooktrace.py)")
    parser.add_argument("--hooks-only", action="store_true", help="skip the polling arm")
    parser.add_argument("--slurm", choices=SLURM_VERSIONS, default=None, metavar="VERSION",
                        help="Slurm generation: the host's packages (default) or a Debian "
                        "root under /var/cache/sunkd (scripts/prepare-slurm-root.sh); "
                        f"one of {', '.join(SLURM_VERSIONS)}")
    parser.add_argument("--chain", action="store_true",
                        help="one chained PrologSlurmctld/EpilogSlurmctld line even where "
                        "Slurm takes several (24.05+): the moment 22.05's figures use")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/hooks.py starts a private Slurm cluster: run it as root", file=sys.stderr)
        return 2
    ok, why = available(args.slurm)
    if not ok:
        print(f"bench/hooks.py: no Slurm {args.slurm or '(host)'} here: {why}", file=sys.stderr)
        return 2
    cycles = args.cycles or (1 if args.quick else 10)
    poll = args.poll or (1.0 if args.quick else 5.0)
    runs = 5 if args.quick else 20
    figures: dict[str, Any] = {"load_average_1m": round(os.getloadavg()[0], 2)}
    print(f"load average {figures['load_average_1m']}", file=sys.stderr)
    figures.update(asyncio.run(measure(cycles, poll, args.trace, args.hooks_only, args.slurm,
                                       True if args.chain else None, runs)))
    targets = {"slurm_to_k8s_p99_ms": {"value": figures["hooks_slurm_to_k8s_p99_ms"],
                                       "target": 100, "better": "lower"},
               "hook_start_ms": {"value": figures["hook_start_ms"], "target": 200,
                                 "better": "lower"}}
    print(json.dumps({"benchmark": "hooks", "figures": figures, "targets": targets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
