"""Slurm hook scripts for a test cluster: what a site puts in slurm.conf, in a directory.

`sunkd hook` runs as slurmctld's PrologSlurmctld/EpilogSlurmctld, i.e. as SlurmUser and
without arguments or the caller's environment (slurm.conf(5)), so a site writes a
one-line wrapper per hook and a token file SlurmUser can read. This makes the same for a
`SlurmCluster` (pass `conf_lines` as its `extra_conf`): the wrappers run a copy of the
hook (`sunkd/slurm/hook.py`, standard library only, so one file is all of it) with the
system python3, or a root's when slurmctld runs in a Debian root (`directory` then lies
in the cluster's directory, which the root sees at the same path; `for_slurm` picks the
form for a generation, for tests and bench/hooks.py alike), settings in
`hook.conf` so that the daemon's URL can be filled in once it listens, and "site"
scripts chained with `--chain`: the prolog records each job's nodes and start time
(`marks/start.JOBID`, Slurm's moment of the start, for benchmarks) and exits with
`site-exit`'s code, the epilog records its end time (`marks/end.JOBID`); the wrappers
record when slurmctld started them (`marks/prolog.JOBID`, `marks/epilog.JOBID`).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import sunkd
from sunkd_testbed.slurm import in_root, root_user

REPO = Path(sunkd.__file__).resolve().parent.parent
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
# Run as the file, isolated and without `site` (it is standard library only): what the
# interpreter does before the hook's first line is start time Slurm waits for.
HOOK = REPO / "sunkd" / "slurm" / "hook.py"


class HookScripts:
    """Token, config and wrapper scripts in a fresh directory SlurmUser can read."""

    def __init__(self, slurm_user: str | None = None, *, directory: Path | None = None,
                 python: str = PYTHON, owner: tuple[int, int] | None = None,
                 chain: bool = True) -> None:
        """`owner`: (uid, gid) of SlurmUser as slurmctld sees it (a root has its own
        uids); by default the host's `slurm_user` (`slurm` when it exists). `chain`: the
        hook runs the site scripts (`--chain`, one `PrologSlurmctld=` line, as 22.05-23.11
        need); without it slurm.conf lists the site's scripts and the hook's on lines of
        their own (24.05 and later)."""
        self.chain = chain
        self.python = python
        if directory is None:
            self.dir = Path(tempfile.mkdtemp(prefix="sunkd-hooks-"))
        else:
            directory.mkdir(parents=True)
            self.dir = directory
        self.dir.chmod(0o755)
        if owner is None:
            entry = pwd.getpwnam(slurm_user or ("slurm" if _has_user("slurm") else "root"))
            owner = (entry.pw_uid, entry.pw_gid)
        self.owner = owner
        self.token_file = self.dir / "token"
        self.token_file.write_text(secrets.token_hex(24) + "\n")
        self.token_file.chmod(0o600)
        os.chown(self.token_file, *owner)
        hook = self.hook = self.dir / "hook.py"
        shutil.copyfile(HOOK, hook)
        hook.chmod(0o644)
        self.config = self.dir / "hook.conf"
        self.site = self.dir / "site-prolog.sh"
        self.marks = self.dir / "marks"
        self.marks.mkdir()
        self.marks.chmod(0o777)
        self.site.write_text(
            "#!/bin/sh\n"
            f"date +%s.%N > {self.marks}/start.$SLURM_JOB_ID\n"
            f'echo "$SLURM_JOB_NODELIST" > {self.marks}/site.$SLURM_JOB_ID\n'
            f"exit $(cat {self.dir}/site-exit 2>/dev/null || echo 0)\n")
        self.site.chmod(0o755)
        site_epilog = self.dir / "site-epilog.sh"
        site_epilog.write_text(f"#!/bin/sh\ndate +%s.%N > {self.marks}/end.$SLURM_JOB_ID\n")
        site_epilog.chmod(0o755)
        self.site_epilog = site_epilog
        for name, event, site in (("prolog.sh", "prolog-slurmctld", self.site),
                                  ("epilog.sh", "epilog-slurmctld", site_epilog)):
            extra = f" --chain {site}" if chain else ""
            script = self.dir / name
            script.write_text(
                "#!/bin/sh\n"
                # When slurmctld started the hook: the interpreter's start is after it.
                f"date +%s.%N > {self.marks}/{name[:-3]}.$SLURM_JOB_ID\n"
                f"exec {python} -I -S {hook} {event}"
                f" --config {self.config}{extra}\n")
            script.chmod(0o755)
        self.configure("http://127.0.0.1:9")

    @classmethod
    def for_slurm(cls, version: str | None, base_dir: Path, *,
                  chain: bool | None = None) -> HookScripts:
        """The hooks as a `SlurmCluster(version=version, base_dir=base_dir)` runs them. The
        host's generation (`version` None or the host's): SlurmUser's, the system python3,
        in a directory of their own, chained (one line, as 22.05-23.11 take). A
        generation run from a Debian root: in `base_dir/hooks` (the root sees the
        cluster's directory at the same path), owned by the root's SlurmUser, run with
        the root's python3, on lines of their own (the form 24.05 and later take).
        `chain` overrides the form."""
        if version is None or not in_root(version):
            return cls(chain=True if chain is None else chain)
        return cls(directory=base_dir / "hooks", python="/usr/bin/python3",
                   owner=root_user(version, "slurm") or (0, 0),
                   chain=False if chain is None else chain)

    @property
    def conf_lines(self) -> list[str]:
        """slurm.conf lines: one each, the hook chaining the site's (Slurm 22.05-23.11
        take one PrologSlurmctld), or the site's script and the hook's on lines of their
        own (24.05 and later run every line, in order)."""
        if self.chain:
            return [f"PrologSlurmctld={self.dir / 'prolog.sh'}",
                    f"EpilogSlurmctld={self.dir / 'epilog.sh'}"]
        return [f"PrologSlurmctld={self.site}", f"PrologSlurmctld={self.dir / 'prolog.sh'}",
                f"EpilogSlurmctld={self.site_epilog}",
                f"EpilogSlurmctld={self.dir / 'epilog.sh'}"]

    def configure(self, url: str, *, fence: bool = False) -> None:
        """Where the hooks POST, and whether the prolog asks the fence."""
        self.config.write_text(f"url = {url}\ntoken_file = {self.token_file}\n"
                               f"timeout = 2\nfence = {'true' if fence else 'false'}\n")
        self.config.chmod(0o644)

    def site_exit(self, code: int) -> None:
        """The exit status of the chained site prolog."""
        path = self.dir / "site-exit"
        path.write_text(f"{code}\n")
        path.chmod(0o644)

    def moment(self, kind: str, job: int | str) -> float | None:
        """When the site prolog (`start`) or epilog (`end`) ran for `job`, or the hook's
        wrapper started (`prolog`, `epilog`), if it did."""
        try:
            return float((self.marks / f"{kind}.{job}").read_text())
        except (OSError, ValueError):
            return None

    def started_since(self, moment: float) -> list[float]:
        """Start times of every job the site prolog saw start after `moment`."""
        times = [self.moment("start", p.name.split(".", 1)[1])
                 for p in self.marks.glob("start.*")]
        return sorted(t for t in times if t is not None and t >= moment)

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
