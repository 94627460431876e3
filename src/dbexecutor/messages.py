"""What crosses the pipe between the scheduler and a child process.

::

    scheduler thread (parent)                                child process
    ─────────────────────────                                ─────────────
    start_child(ChildConfig) ──────────────────────────────► initializer
                             ◄─────────── Ready | InitFailed
    Call(job_id, attempt, payload, inputs) ────────────────► main thread: run it
      or Calls([Call, ...]): the jobs of one tick, queued in order
                             ◄──────────── AwaitCommit(job_id, attempt)
                                                                   an early Call's job opens a
                                                                   transaction: did its lease commit?
    Committed(job_id, attempt) ────────────────────────────► yes (the answer, once it did)
                             ◄──────────── Beat(job_id, attempt)   heartbeat thread,
                                                                   while the job runs
                             ◄──────────── Progress(...)           what the job reported
                                                                   (report_progress)
                             ◄──────────── Result(...)             the outcome
    Stop ──────────────────────────────────────────────────► exit

A child never touches the database unless a job asks for a transaction
(``dbexecutor.transaction()``; then it also commits that job's completion,
:class:`Result` says so): the results a job takes as arguments
travel inside its :class:`Call`, still signed, and the child checks them; its
beats go to the parent, which renews the leases of all its children in one
statement and writes every outcome. The blobs are passed through unopened,
so the parent never unpickles a payload or a result on a child's behalf.

Every message is a ``NamedTuple``: named at both ends, and as cheap to pickle
as the bare tuple it replaces (prefetched short jobs send many of them).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Union

from .serialization import Signer

__all__ = ["DatabaseAddress", "ChildConfig", "Call", "Committed", "Stop", "AwaitCommit", "Ready", "InitFailed", "Beat", "Progress", "Result", "ToChild", "FromChild"]


class DatabaseAddress(NamedTuple):
    """Where a job's transaction connects (``dbexecutor.transaction()``): plain text, so no SQLAlchemy to unpickle it."""

    url: str  # the executor's URL, password included
    prefix: str  # its table prefix


class ChildConfig(NamedTuple):
    """Everything a child is started with (the process's only arguments besides its pipes)."""

    heartbeat_interval: float  # seconds between beats while a job runs
    initializer: Callable[..., Any] | None
    initargs: tuple[Any, ...]
    signer: Signer  # checks payloads and upstream results, signs results and exceptions
    database: DatabaseAddress | None = None  # for jobs that ask for a transaction (None: they cannot)


# -- parent → child ---------------------------------------------------------------


class Call(NamedTuple):
    """Run one job: ``attempt`` is its lease token, ``payload`` the signed pickle of the call.

    ``inputs`` maps upstream job ids to their stored (signed) result pickles:
    the ones the payload's ``JobRef`` and ``ArgRef`` arguments name, or, for
    a row that did not record them, every done upstream's. ``refs`` is the
    row's ``arg_refs``, in order: an ``ArgRef`` names its upstream by position there.
    """

    job_id: int
    attempt: int
    payload: bytes
    inputs: dict[int, bytes]
    refs: tuple[int, ...] = ()
    #: Sent before the transaction that leased it committed: a job transaction
    #: (``dbexecutor.transaction()``) begins only once ``Committed`` arrives,
    #: which the child asks for (``AwaitCommit``).
    early: bool = False
    #: The stored by-value functions the payload names that this child has not
    #: been sent before, as ``(digest, pickle)`` (see ``dbexecutor.store.functions``).
    functions: tuple[tuple[str, bytes], ...] = ()


class Calls(NamedTuple):
    """Several jobs for one child at once, run in this order (one message per tick instead of one per job)."""

    calls: tuple[Call, ...]


class Committed(NamedTuple):
    """The lease of an ``early`` call committed: its job's transaction may now begin, and complete fenced by that lease.

    The answer to :class:`AwaitCommit`, sent once both the child has asked
    and the commit is done. Until then the row does not show the lease (or
    does not exist yet), and a fenced completion would find it lost. If the
    commit fails instead, the child is killed and never gets this.
    """

    job_id: int
    attempt: int


class Stop(NamedTuple):
    """Finish: the child exits once it reads this (it runs one job at a time, so it is idle then)."""


# -- child → parent -----------------------------------------------------------------


class AwaitCommit(NamedTuple):
    """The job of an ``early`` call opens a transaction: answer with :class:`Committed` once its lease has committed.

    The child asks before its ``BEGIN``, holding no lock (on SQLite the
    transaction takes the write lock, which the parent's next tick would
    wait for), and waits for the answer. Asked only by the jobs that need
    it: most jobs open no transaction, and a message to every child whose
    job started early (a pipe write that wakes that child) cost the parent
    60 us of CPU a job here.
    """

    job_id: int
    attempt: int


class Ready(NamedTuple):
    """The child started and its initializer returned: from now on it beats for the job it runs."""


class InitFailed(NamedTuple):
    """The initializer raised: ``error`` is ``Type: message``, ``traceback`` the child's formatted traceback."""

    error: str
    traceback: str


class Beat(NamedTuple):
    """The child is alive and still running this attempt (first ~0.1 s after it starts, then every interval)."""

    job_id: int
    attempt: int


class Progress(NamedTuple):
    """What the running attempt last reported with ``dbexecutor.report_progress`` (the parent keeps the latest)."""

    job_id: int
    attempt: int
    fraction: float | None
    message: str | None


class Result(NamedTuple):
    """How one attempt ended in the child; the parent writes it to the row.

    ``blob`` is the signed pickle of the return value (``ok``) or of the
    exception; ``error`` is ``Type: message`` on failure; ``started`` and
    ``ended`` are the child's wall-clock times. ``loaded`` is False when the
    job failed before its function ran: its payload or an upstream result
    could not be checked or unpickled here (a deployment problem: code not
    importable, another secret). ``refused``: the job never ran because this
    child could not load its function or arguments (why, and on which host):
    not the job's failure, it goes back for another executor.
    ``finalized``: the job wrote through ``dbexecutor.transaction()`` and the
    child committed its completion with those writes: the row is done
    already, so the parent only resolves futures and tells others.
    """

    job_id: int
    attempt: int
    ok: bool
    blob: bytes
    error: str | None
    started: float
    ended: float
    loaded: bool = True
    refused: str | None = None
    finalized: bool = False


ToChild = Union[Call, Calls, Committed, Stop]
FromChild = Union[Ready, InitFailed, Beat, Progress, Result, AwaitCommit]
