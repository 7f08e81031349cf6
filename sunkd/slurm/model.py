"""The Slurm model the rest of sunkd sees (`SlurmNode`, `SlurmJob`) and the errors a
slurmrestd call can raise. Separate from the client so that normalization, the source and
the actuator can share them without importing HTTP."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sunkd.domain.events import SlurmNodeObserved
from sunkd.domain.slurmnode import slurm_busy, slurm_drained

# ---------------------------------------------------------------------------- errors


class SlurmError(Exception):
    """Base of everything this client raises."""


class SlurmAuthError(SlurmError):
    """slurmrestd or slurmctld refused our identity. The message carries a hint."""


class SlurmTimeoutError(SlurmError):
    """No answer within the request timeout."""


class SlurmUnavailableError(SlurmError):
    """slurmrestd is unreachable or cannot reach slurmctld (`controller_down`)."""

    def __init__(self, message: str, *, cause: str = "controller_down") -> None:
        super().__init__(message)
        self.cause = cause


class SlurmApiError(SlurmError):
    """A request failed: non-2xx status or a non-empty `errors[]` (even in a 200)."""

    def __init__(self, message: str, *, status: int, errors: Sequence[Mapping[str, Any]] = ()):
        super().__init__(message)
        self.status = status
        self.errors = tuple(errors)

    @property
    def error_numbers(self) -> tuple[int, ...]:
        numbers: list[int] = []
        for item in self.errors:
            number = item.get("error_number", item.get("errno"))
            if isinstance(number, int):
                numbers.append(number)
        return tuple(numbers)


class SlurmPayloadError(SlurmError):
    """The server answered something we cannot interpret; `field` names the culprit
    (a JSON path, or the request when the answer as a whole is bad). `cause` is the
    source.health cause it turns into: `bad_payload` (malformed or hostile JSON),
    `duplicate_node` (one node name listed twice), `too_large` (over
    slurm.max_response_bytes), `truncated` (the body ended early), `bad_response`
    (not a valid HTTP answer at all)."""

    def __init__(self, field_path: str, problem: str, *, cause: str = "bad_payload") -> None:
        super().__init__(f"malformed slurmrestd payload at {field_path}: {problem}")
        self.field = field_path
        self.problem = problem
        self.cause = cause


# ----------------------------------------------------------------------------- model


class SlurmNode(NamedTuple):
    """One Slurm node, the same whatever REST version described it.

    A NamedTuple rather than a frozen dataclass: a poll builds 10k of them and tuple
    construction is several times cheaper than frozen-dataclass __setattr__ calls.
    """

    name: str
    state: str  # base state, upper case: IDLE MIXED ALLOCATED DOWN ERROR FUTURE UNKNOWN
    flags: frozenset[str] = frozenset()  # DRAIN NOT_RESPONDING COMPLETING ...
    reason: str | None = None
    reason_set_by: str | None = None
    reason_time: float | None = None
    cpus: int = 0
    alloc_cpus: int = 0
    gpus_total: int = 0
    gpus_used: int = 0
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    comment: str | None = None
    boot_time: float | None = None
    last_busy: float | None = None
    gres: str | None = None  # the configured GRES as Slurm reports it (`gpu:a100:8(S:0)`)
    slurmd_start_time: float | None = None  # when the slurmd slurmctld heard last started

    @property
    def is_drain(self) -> bool:
        # UNDRAIN can linger in the state next to DRAIN (docs/slurm.md, "Measured behaviour").
        return "DRAIN" in self.flags and "UNDRAIN" not in self.flags

    @property
    def is_busy(self) -> bool:
        return slurm_busy(self.to_observed())

    @property
    def is_drained(self) -> bool:
        """Safe to hand to Kubernetes: the domain's one definition
        (`slurmnode.slurm_drained`: DRAIN, nothing allocated or completing, in contact)."""
        return slurm_drained(self.to_observed())

    @property
    def display_state(self) -> str:
        """What sinfo prints (`draining`, `drained`, `idle*` ...), for humans."""
        if self.is_drain:
            text = "draining" if self.is_busy else "drained"
        else:
            text = self.state.lower()
        return text + ("*" if "NOT_RESPONDING" in self.flags else "")

    def to_observed(self, jobs: int = 0, job_end: float | None = None) -> SlurmNodeObserved:
        """The observation of this node; `jobs`/`job_end` come from `GET /jobs`."""
        return SlurmNodeObserved(
            node=self.name,
            state=self.state,
            flags=tuple(sorted(self.flags)),
            reason=self.reason,
            reason_set_by=self.reason_set_by,
            reason_time=self.reason_time,
            cpus=self.cpus,
            alloc_cpus=self.alloc_cpus,
            gpus_total=self.gpus_total,
            gpus_used=self.gpus_used,
            partitions=self.partitions,
            features=self.features,
            comment=self.comment,
            boot_time=self.boot_time,
            last_busy=self.last_busy,
            jobs=jobs,
            job_end=job_end,
            gres=self.gres,
            slurmd_start_time=self.slurmd_start_time,
        )


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: int
    state: str  # primary state, upper case: PENDING RUNNING COMPLETING ...
    state_flags: tuple[str, ...] = ()  # v0.0.40+ extra states (REQUEUED, ...)
    partition: str = ""  # may be "a,b" for a pending job submitted to several
    nodes: tuple[str, ...] = ()  # expanded from the hostlist; empty while pending
    node_count: int = 0
    time_limit: float | None = None  # minutes; None = unlimited / unset
    start_time: float | None = None
    end_time: float | None = None
    state_reason: str | None = None
    # `--nodelist` of the job (`required_nodes`, a hostlist): a pending job waits for
    # these very nodes
    required_nodes: tuple[str, ...] = ()

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(p for p in self.partition.split(",") if p)
