"""The records that cross module boundaries: what the executor hands the store, what the store returns.

No database and no process code here: plain dataclasses, so that the
executor, the scheduler, the child pool and the store agree on shapes
without importing each other. Treat them as values. The ones made for
every job (:class:`NewJob`, :class:`Submitted`, :class:`Claimed`,
:class:`Report`, :class:`Final`) are slotted but not frozen: a frozen
dataclass sets each field through ``object.__setattr__``, four times the
cost of a plain one (1.2 against 0.3 µs for seven fields), and the loop
made several of them for each job it ran. What the operator commands and
the web UI read is in :mod:`~dbexecutor.readmodels`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import states

__all__ = [
    "NewJob",
    "Unwritten",
    "Earlier",
    "Dep",
    "Submitted",
    "Claimed",
    "Report",
    "Final",
    "Finished",
    "Registration",
    "Renewal",
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
    # Most jobs take no upstream result: "" at the cost of a comparison, not a split and a generator.
    return tuple(map(int, text.split(","))) if text else ()


# -- what the executor and the scheduler exchange with the store ---------------------------------


class Unwritten:
    """A dependency on a job this process submitted whose row is not written yet.

    ``submit`` gives it instead of an id, so that a chain of submits (each
    taking the previous future) does not write its rows one commit at a time
    just to learn each upstream's id: the submit queue turns it into the id,
    or into :class:`Earlier` when both rows go in with the same write.
    Compared by identity: one per upstream future.
    """

    __slots__ = ("future",)

    def __init__(self, future: Any) -> None:
        self.future = future

    def __repr__(self) -> str:
        return f"Unwritten({self.future!r})"


@dataclass(frozen=True)
class Earlier:
    """A dependency on the ``index``-th job of the same write: its id is known once that row is inserted."""

    index: int


#: What a new job's ``deps`` and ``refs`` hold: a job id, or a job still being written.
Dep = int | Unwritten | Earlier


@dataclass(slots=True)
class NewJob:
    """What ``submit`` hands the store: a pickled payload and the row's options."""

    fn_name: str
    payload: bytes
    # Ids, except while an upstream is still being written (see Unwritten and Earlier).
    deps: tuple[Dep, ...]
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
    refs: tuple[Dep, ...] = ()  # the deps whose results the payload takes as arguments, in the payload's ArgRef order
    retry_delay: float | None = None  # backoff base for this job (None: the executor's default)

    @property
    def leasable(self) -> bool:
        """Whether the row could be leased by the statement that inserts it (no upstream, no key, not a batch)."""
        return not self.deps and self.key is None and not self.batch

    def renamed(self, named: Mapping[Dep, Dep]) -> NewJob:
        """This job with each upstream in ``named`` (in its deps and its refs) replaced by what it maps to; itself if none is."""
        if not named:
            return self
        return replace(self, deps=tuple(named.get(d, d) for d in self.deps), refs=tuple(named.get(d, d) for d in self.refs))


@dataclass(slots=True)
class Submitted:
    """The row a submit produced, or found (``existing``) when its key was taken."""

    job_id: int
    state: str
    result: bytes | None = None
    existing: bool = False


@dataclass(slots=True)
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


@dataclass(slots=True)
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
    stopped: bool = False  # killed because someone asked it to stop: the job ends cancelled, not retried
    finalized: bool = False  # the child committed the completion with the job's own writes: the row is done already


@dataclass(slots=True)
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
    # Dependents that became ready (where UPDATE returns no rows, every
    # dependent counted down: more, never fewer, so a claim is not skipped).
    released: int = 0
    refused: list[int] = field(default_factory=list)  # put back: the child could not load them
    finalized: list[int] = field(default_factory=list)  # done by their children's own commits (job transactions)

    def results(self) -> dict[int, bytes]:
        """The stored results of the jobs these reports finished done, by id (what their dependents take)."""
        return {f.job_id: f.result for f in self.finals if f.state == states.DONE and f.result is not None}

    def add(self, other: Finished) -> None:
        """Take in what another batch of reports, recorded in the same transaction, changed."""
        self.finals += other.finals
        self.retried += other.retried
        self.lost = sorted({*self.lost, *other.lost})
        self.released += other.released
        self.refused += other.refused
        self.finalized += other.finalized


@dataclass(frozen=True)
class Renewal:
    """What one lease renewal learnt: ``lost`` leases (reclaimed, finished elsewhere) and jobs asked to ``stop``.

    A job in ``stop`` is still this owner's: it kills the job's process tree
    and reports the attempt as stopped, which ends the job ``cancelled``.
    A job in ``done`` was finished by the very attempt held (its child
    committed a job transaction, and its Result is on the way): not lost.
    """

    lost: set[int] = field(default_factory=set)
    stop: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)


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


