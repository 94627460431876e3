"""The records that cross module boundaries: what the executor hands the store, what the store returns.

No database and no process code here: plain frozen dataclasses, so that the
executor, the scheduler, the command line and the store agree on shapes
without importing each other. The public ones (exported from ``dbexecutor``)
are :class:`GroupInfo` and the read models of the operator commands:
:class:`StatusReport`, :class:`JobSummary`, :class:`JobDetail`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import states

__all__ = [
    "NewJob",
    "Submitted",
    "Claimed",
    "Report",
    "Final",
    "Finished",
    "GroupInfo",
    "StateCounts",
    "RunningJob",
    "OldestReady",
    "StatusReport",
    "JobSummary",
    "Edge",
    "AttemptRecord",
    "JobDetail",
    "Registration",
    "ExecutorInfo",
    "format_refs",
    "parse_refs",
]


def format_refs(refs: Sequence[int]) -> str:
    """The ``arg_refs`` column's text for ``refs``."""
    return ",".join(map(str, refs))


def parse_refs(text: str | None) -> tuple[int, ...] | None:
    """Inverse of :func:`format_refs`; None stays None (not recorded)."""
    if text is None:
        return None
    return tuple(int(x) for x in text.split(",") if x)


# -- what the executor and the scheduler exchange with the store ---------------------------------


@dataclass(frozen=True)
class NewJob:
    """What ``submit`` hands the store: a pickled payload and the row's options."""

    fn_name: str
    payload: bytes
    deps: tuple[int, ...]
    key: str | None = None
    group: str = states.DEFAULT_GROUP
    queue: str = states.DEFAULT_QUEUE
    weight: int | None = None  # set the group's weight (None: leave it as configured)
    priority: int = 0
    timeout: float | None = None
    retries: int = 0
    run_after: float | None = None
    submitted_by: str | None = None
    batch: bool = False  # a container whose ``deps`` are its children, in order
    refs: tuple[int, ...] = ()  # the deps whose results the payload takes as arguments
    retry_delay: float | None = None  # backoff base for this job (None: the executor's default)

    @property
    def leasable(self) -> bool:
        """Whether the row could be leased by the statement that inserts it (no upstream, no key, not a batch)."""
        return not self.deps and self.key is None and not self.batch


@dataclass(frozen=True)
class Submitted:
    """The row a submit produced, or found (``existing``) when its key was taken."""

    job_id: int
    state: str
    result: bytes | None = None
    existing: bool = False


@dataclass(frozen=True)
class Claimed:
    """A job this executor now holds the lease of, with the token ``attempt``.

    ``refs``: the upstream jobs whose results the payload takes as arguments
    (None: not recorded, a row from before schema version 3: every done
    upstream's result is needed).
    """

    job_id: int
    attempt: int
    payload: bytes
    fn_name: str
    timeout: float | None
    refs: tuple[int, ...] | None = ()
    retry_delay: float | None = None


@dataclass(frozen=True)
class Report:
    """How one attempt ended, as the parent saw it.

    ``outcome`` is what the attempts table records (``ok``, ``exception``,
    ``timeout``, ``signal 9 (SIGKILL)``...); ``error`` is ``Type: message``
    for people; ``retry_delay`` the backoff base if the attempt may be retried.
    """

    job_id: int
    attempt: int
    ok: bool
    blob: bytes  # pickled result, or pickled exception
    outcome: str
    error: str | None = None
    worker: str | None = None
    started_at: float | None = None
    ended_at: float = 0.0
    retry_delay: float = 1.0
    fn_name: str = ""
    refused: bool = False  # the child could not load the job (``error`` says why): not a failure of the job


@dataclass(frozen=True)
class Final:
    """A job that reached a final state (``result`` holds the result or exception pickle)."""

    job_id: int
    state: str
    result: bytes | None


@dataclass
class Finished:
    """What a batch of reports changed: final rows, retried ids, ids whose lease was lost."""

    finals: list[Final] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    released: int = 0  # dependents that became ready
    refused: list[int] = field(default_factory=list)  # put back: the child could not load them


# -- public read models ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupInfo:
    """A fair-share group as stored: weight, concurrency limit (None: none) and virtual time."""

    name: str
    weight: int
    limit: int | None
    vtime: float


@dataclass(frozen=True)
class StateCounts:
    """Number of jobs in each state (every state present, zero included)."""

    waiting: int = 0
    ready: int = 0
    leased: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0

    @classmethod
    def of(cls, counts: dict[str, int]) -> StateCounts:
        """From ``{state: count}`` (states not present count zero)."""
        return cls(**{s: int(counts.get(s, 0)) for s in states.ALL_STATES})

    @property
    def total(self) -> int:
        """Jobs in any state."""
        return sum(asdict(self).values())

    def as_dict(self) -> dict[str, int]:
        """``{state: count}`` in life-cycle order."""
        return {s: getattr(self, s) for s in states.ALL_STATES}


@dataclass(frozen=True)
class RunningJob:
    """A leased or running job: who holds it, which attempt, for how long (seconds, None before it started).

    ``worker_alive``: whether its executor is alive (None: not in the registry).
    ``rescue_in``: if it is dead, seconds until the job is put back to ready
    (0: at the next look of any executor).
    """

    id: int
    function: str
    state: str
    group: str
    worker: str | None
    attempt: int
    age: float | None
    worker_alive: bool | None = None
    rescue_in: float | None = None


@dataclass(frozen=True)
class OldestReady:
    """The job that has been ready longest (``run_after``: not before then)."""

    id: int
    function: str
    group: str
    age: float
    run_after: float | None


@dataclass(frozen=True)
class StatusReport:
    """What ``dbexecutor status`` shows: counts per state and per group, running jobs, the oldest ready job."""

    states: StateCounts
    groups: dict[str, StateCounts]
    running: list[RunningJob]
    oldest_ready: OldestReady | None
    queues: dict[str, StateCounts] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Jobs in any state."""
        return self.states.total

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape of ``dbexecutor status --json``)."""
        return {
            "states": self.states.as_dict(),
            "total": self.total,
            "groups": {g: c.as_dict() for g, c in sorted(self.groups.items())},
            "queues": {q: c.as_dict() for q, c in sorted(self.queues.items())},
            "running": [asdict(r) for r in self.running],
            "oldest_ready": None if self.oldest_ready is None else asdict(self.oldest_ready),
        }


@dataclass(frozen=True)
class JobSummary:
    """One line of ``dbexecutor list``."""

    id: int
    state: str
    queue: str
    group: str
    function: str
    key: str | None
    attempt: int
    retries: int
    created_at: float
    finished_at: float | None
    worker: str | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Edge:
    """A dependency edge as seen from one job: the job at the other end and its state."""

    id: int
    state: str


@dataclass(frozen=True)
class AttemptRecord:
    """One row of the attempts table: how one run of a job ended."""

    attempt: int
    worker: str | None
    started_at: float | None
    ended_at: float
    outcome: str
    detail: str | None


@dataclass(frozen=True)
class JobDetail:
    """Everything stored about one job: its row (blobs included), its edges both ways, its attempts."""

    job: dict[str, Any]
    depends_on: list[Edge]
    dependents: list[Edge]
    attempts: list[AttemptRecord]


# -- the registry of executors ----------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """What an executor, worker or submit-only process says about itself when it registers."""

    name: str  # host:pid:token, the lease_owner of the jobs it holds
    kind: str  # executor, worker, submitter
    host: str
    pid: int
    pid_started: float | None
    version: str
    slots: int
    wake: str | None = None  # host:port where a datagram wakes it
    queues: tuple[str, ...] | None = ()  # the queues it serves (None: every queue)


@dataclass(frozen=True)
class ExecutorInfo:
    """A registered executor as ``dbexecutor workers`` shows it.

    ``alive``: it beats, has not stopped, and (on the machine asking) its
    process exists. ``rescue_in``: for a dead one that still holds jobs,
    seconds until they are put back to ready (0: at the next look).
    """

    name: str
    kind: str
    host: str
    pid: int
    version: str
    slots: int
    queues: list[str] | None  # None: every queue
    started_at: float
    last_beat: float
    stopped_at: float | None
    running: int
    alive: bool
    age: float
    since_beat: float
    rescue_in: float | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)
