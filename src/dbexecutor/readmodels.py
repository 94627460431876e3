"""The read models: what the operator commands, the web UI and :class:`~dbexecutor.DBExecutor`'s inspection methods return.

The public ones (exported from ``dbexecutor``) are :class:`GroupInfo`,
:class:`JobProgress`, :class:`StatusReport`, :class:`JobSummary`,
:class:`JobDetail` and :class:`ExecutorInfo`; :class:`Overview` and
:class:`JobGraph` are what the web UI serves. Frozen dataclasses with no
database and no process code, made once per request, not per job (the
records the loop makes for every job are in :mod:`~dbexecutor.records`).

Every ``as_dict`` uses one set of field names, the same in every ``--json``
output and every UI endpoint: ``id``, ``state``, ``group``, ``function``,
``key``, ``worker``, ``attempt``... never the column names behind them
(``group_key``, ``fn_name``, ``job_key``, ``lease_owner``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from . import states

__all__ = [
    "GroupInfo",
    "StateCounts",
    "JobProgress",
    "RunningJob",
    "OldestReady",
    "StatusReport",
    "JobFilter",
    "JobSummary",
    "JobPage",
    "Edge",
    "AttemptRecord",
    "JobDetail",
    "StopRequest",
    "Throughput",
    "Overview",
    "GraphNode",
    "JobGraph",
    "ExecutorInfo",
    "HealthReport",
]


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
class JobProgress:
    """What a running job last said about itself (:func:`dbexecutor.report_progress`).

    ``fraction``: from 0 to 1 (None: the job gave only a message); ``at``:
    when its owner wrote it (the database server's clock).
    """

    fraction: float | None
    message: str | None
    at: float | None

    @classmethod
    def of(cls, fraction: float | None, message: str | None, at: float | None) -> JobProgress | None:
        """The progress stored in a row's columns, or None if the job never reported any."""
        if fraction is None and message is None:
            return None
        return cls(None if fraction is None else float(fraction), message, at)


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
    progress: float | None = None
    progress_message: str | None = None
    terminate_requested: float | None = None


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
class JobFilter:
    """Which jobs an operator means: every field given must match (``()``/None: any).

    ``function`` is a substring of the function's qualified name, or with
    ``exact_function`` the whole name (which a list can page through by
    index). ``created_before``/``created_after`` are times on the database
    server's clock.
    """

    states: tuple[str, ...] = ()
    queue: str | None = None
    group: str | None = None
    function: str | None = None
    exact_function: bool = False
    key: str | None = None
    created_before: float | None = None
    created_after: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", tuple(self.states))  # frozen; a list given is kept as a tuple
        bad = [s for s in self.states if s not in states.ALL_STATES]
        if bad:
            raise ValueError(f"unknown state(s) {', '.join(map(repr, bad))}; the states are {', '.join(states.ALL_STATES)}")

    @property
    def empty(self) -> bool:
        """Whether nothing narrows the jobs down."""
        return self == JobFilter(exact_function=self.exact_function)


@dataclass(frozen=True)
class JobSummary:
    """One line of ``dbexecutor list`` and of the UI's list of jobs."""

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
    progress: float | None = None
    progress_message: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class JobPage:
    """One page of a list of jobs, newest first, and the ids that fetch its neighbours.

    ``older``: pass as ``before`` for the next page (None: this is the last);
    ``newer``: pass as ``after`` for the previous page (None: this is the first).
    """

    jobs: list[JobSummary]
    older: int | None
    newer: int | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"jobs": [j.as_dict() for j in self.jobs], "older": self.older, "newer": self.newer}


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
    """Everything stored about one job: its row, its edges both ways, its attempts.

    ``payload`` and ``result`` are the stored pickles (``result`` holds the
    exception of a failed job); they are never unpickled by the readers, and
    :meth:`as_dict` leaves them out.
    """

    id: int
    state: str
    function: str
    queue: str
    group: str
    key: str | None
    priority: int
    timeout: float | None
    retries: int
    retry_delay: float | None
    attempt: int
    batch: bool
    open_deps: int
    run_after: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    worker: str | None
    lease_expires: float | None
    submitted_by: str | None
    error: str | None
    arg_refs: tuple[int, ...] | None
    failed_upstream: int | None
    progress: JobProgress | None
    terminate_requested: float | None
    payload: bytes = field(repr=False)
    result: bytes | None = field(repr=False)
    depends_on: list[Edge] = field(default_factory=list)
    dependents: list[Edge] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, without the pickles (see ``dbexecutor show --json``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("payload", "result")}
        out["arg_refs"] = None if self.arg_refs is None else list(self.arg_refs)
        out["progress"] = None if self.progress is None else asdict(self.progress)
        out["depends_on"] = [asdict(e) for e in self.depends_on]
        out["dependents"] = [asdict(e) for e in self.dependents]
        out["attempts"] = [asdict(a) for a in self.attempts]
        return out


@dataclass(frozen=True)
class StopRequest:
    """What asking jobs to stop did: ``cancelled`` (had not started, with their dependents),
    ``terminating`` (running: their owners kill them at their next beat), and why the others were not."""

    cancelled: list[int]
    terminating: list[int]
    refused: dict[int, str]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``dbexecutor cancel --json``)."""
        return {"cancelled": self.cancelled, "terminating": self.terminating, "not_cancelled": self.refused}


@dataclass(frozen=True)
class Throughput:
    """Jobs that finished in each of the last few minutes, per final state (oldest bucket first).

    Bucket ``i`` spans ``[since + i * bucket, since + (i + 1) * bucket)`` on
    the database server's clock; the last one ends now.
    """

    since: float
    bucket: float
    done: list[int]
    failed: list[int]
    cancelled: list[int]

    def rate(self, buckets: int | None = None) -> float:
        """Jobs done or failed per second over the last ``buckets`` buckets (default: all)."""
        n = len(self.done) if buckets is None else max(1, min(buckets, len(self.done)))
        finished = sum(self.done[-n:]) + sum(self.failed[-n:])
        return finished / (n * self.bucket) if n else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "rate": self.rate()}


@dataclass(frozen=True)
class Overview:
    """What the UI's overview and ``status --watch`` show: counts, group settings, throughput and an ETA.

    ``queued``: jobs not finished yet (waiting, ready, leased, running);
    ``eta``: seconds until they are done at the recent rate (None: nothing
    finished lately, or nothing queued); ``workers_alive``: registered
    executors and workers that beat (submit-only ones included).
    """

    status: StatusReport
    groups: list[GroupInfo]
    throughput: Throughput
    queued: int
    eta: float | None
    workers_alive: int
    now: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            **self.status.as_dict(),
            "group_settings": {g.name: {"weight": g.weight, "limit": g.limit} for g in self.groups},
            "throughput": self.throughput.as_dict(),
            "queued": self.queued,
            "eta": self.eta,
            "workers_alive": self.workers_alive,
            "now": self.now,
        }


@dataclass(frozen=True)
class GraphNode:
    """A job in a graph of jobs: enough to draw, colour and link it."""

    id: int
    state: str
    function: str
    key: str | None
    group: str
    batch: bool
    progress: float | None = None


@dataclass(frozen=True)
class JobGraph:
    """Jobs and the dependency edges between them, ``(upstream, dependent)``; ``truncated``: more were left out."""

    nodes: list[GraphNode]
    edges: list[tuple[int, int]]
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"nodes": [asdict(n) for n in self.nodes], "edges": [list(e) for e in self.edges], "truncated": self.truncated}


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


@dataclass(frozen=True)
class HealthReport:
    """What ``dbexecutor health`` checks, past reaching the database.

    ``schema_version``: what the tables record (None: no tables);
    ``runnable_groups``: groups with work that could start now and are not
    paused; ``workers_alive``: registered executors and workers that run jobs
    and beat.
    """

    schema_version: int | None
    expected_version: int
    runnable_groups: list[str]
    workers_alive: int

    @property
    def schema_current(self) -> bool:
        """Whether the tables are at the version this dbexecutor writes."""
        return self.schema_version == self.expected_version

    @property
    def starved(self) -> list[str]:
        """Groups with work that could start but nobody alive to run it."""
        return [] if self.workers_alive else list(self.runnable_groups)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "schema_current": self.schema_current, "starved": self.starved}
