"""What runs inside a child process: one job at a time, a heartbeat beside it.

::

    parent ◄── Ready ─────────────────────── started, initializer done
    parent ─── Call(job, attempt, payload, ► inbox thread: reads the pipe at once
                    inputs) ───────────────► main thread: check and load the payload
                                             and the upstream results it takes, run fn
           ◄── AwaitCommit(job, attempt) ─── an early call's job opens a transaction:
           ─── Committed(job, attempt) ────► its lease committed (the transaction
                                             begins after this answer)
           ◄── Result ────────────────────── the outcome, signed (never writes a row)
           ◄── Beat ──────────────────────── heartbeat thread, while a job runs;
                                             it ends the child if the lifeline closes
           ◄── Progress ──────────────────── what the job reports (report_progress),
                                             the latest value, a few times a second at most

A child opens no database connection (nor imports SQLAlchemy) unless a job
asks for a transaction (``dbexecutor.transaction()``, :mod:`dbexecutor.transactions`):
then it connects once and commits that job's completion together with the
job's writes, fenced by the attempt token, and its Result says so. Otherwise
the parent renews the lease of the attempt a child runs while that child's
beats are fresh, and writes the outcome guarded by the attempt token. A child that
freezes, or a job that holds the GIL, stops the beats, so the lease runs out
as if the child had renewed it itself. When the parent dies (a pipe closes
or breaks) the child exits quietly, taking its job's subprocesses with it.
"""

from __future__ import annotations

import functools
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import psutil

from . import byvalue, progress, serialization, transactions
from .errors import CannotRunHere
from .messages import AwaitCommit, Beat, Call, Calls, ChildConfig, Committed, InitFailed, Progress, Ready, Result, Stop, FromChild

__all__ = ["child_main", "run_chunk"]

# First beat soon after a job starts, so that the row says "running" while a
# long job runs; jobs shorter than this go from leased to done.
_RUNNING_MARK_DELAY = 0.1
_PARENT_GONE = 70  # exit status of a child whose parent died
# A job may report progress in a tight loop: the pipe carries at most one
# value per this many seconds, the rest waits for the next beat (latest wins).
_PROGRESS_EVERY = 0.25


def run_chunk(fn: Callable[..., Any], chunk: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Run ``fn`` over one ``map`` chunk (the job a chunked ``map`` stores for each chunk)."""
    return [fn(*args) for args in chunk]


def _die_with_parent() -> NoReturn:
    """The parent is gone: take the job's own subprocesses down too, then exit without a traceback."""
    try:
        for proc in psutil.Process().children(recursive=True):
            proc.kill()
    except psutil.Error:
        pass
    os._exit(_PARENT_GONE)


class _Link(threading.Thread):
    """The child's end of its pipe: two threads send on it, one reads it, and a closed pipe means the parent died.

    Reading happens in a thread of its own, so that the pipe towards the
    child never fills up while a job runs: the parent, sending the next job,
    and the child, sending a large result, can never both wait on a full
    pipe at once.
    """

    def __init__(self, conn: Connection) -> None:
        super().__init__(name="dbexecutor-inbox", daemon=True)
        self._conn = conn
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[Call | Stop] = queue.SimpleQueue()
        # Leases of early calls the parent said committed (the latest few:
        # it answers only what was asked, by a job that opened a transaction).
        self._committed: dict[tuple[int, int], None] = {}
        self._commit_seen = threading.Condition()

    def send(self, msg: FromChild) -> None:
        try:
            with self._lock:
                self._conn.send(msg)
        except OSError:  # BrokenPipeError: nobody is left to read it
            _die_with_parent()

    def recv(self) -> Call | Stop:
        """The next message from the parent (waits for it)."""
        return self._inbox.get()

    def wait_committed(self, job_id: int, attempt: int) -> None:
        """Ask the parent whether the lease ``(job_id, attempt)`` committed, and wait until it says so (it kills this child if it never does)."""
        self.send(AwaitCommit(job_id, attempt))
        with self._commit_seen:
            self._commit_seen.wait_for(lambda: (job_id, attempt) in self._committed)

    def run(self) -> None:
        while True:
            try:
                msg: Call | Calls | Committed | Stop = self._conn.recv()
            except (EOFError, OSError):
                _die_with_parent()
            if isinstance(msg, Committed):
                with self._commit_seen:
                    self._committed[(msg.job_id, msg.attempt)] = None
                    while len(self._committed) > 64:
                        del self._committed[next(iter(self._committed))]
                    self._commit_seen.notify_all()
                continue
            if isinstance(msg, Calls):
                for call in msg.calls:
                    self._inbox.put(call)
                continue
            self._inbox.put(msg)
            if isinstance(msg, Stop):
                return


class _Heartbeat(threading.Thread):
    """Beats to the parent while a job runs; ends the whole child if the parent dies."""

    def __init__(self, link: _Link, lifeline: Connection, interval: float) -> None:
        super().__init__(name="dbexecutor-heartbeat", daemon=True)
        self.link, self.lifeline, self.interval = link, lifeline, interval
        self._lock = threading.Lock()
        self._job: tuple[int, int] | None = None
        self._next = 0.0
        self._wake_r, self._wake_w = os.pipe()
        # The thread waits without a deadline (no job): only then must a new job wake it.
        self._idle = False
        self._progress: Progress | None = None  # reported, not sent yet
        self._progress_sent = 0.0  # monotonic time of the last Progress sent

    def start_job(self, job_id: int, attempt: int) -> None:
        """A job starts: its first beat is due shortly.

        Jobs that follow each other do not wake the thread: it waits for
        the previous job's due time, which comes no later than this one's,
        and then reads the job and the time again. One wake-up per job was
        a thread switch and two system calls, as much as a trivial job costs.
        """
        with self._lock:
            self._job = (job_id, attempt)
            self._next = time.monotonic() + min(_RUNNING_MARK_DELAY, self.interval)
            self._progress, self._progress_sent = None, 0.0
            wake, self._idle = self._idle, False
        if wake:
            os.write(self._wake_w, b"x")

    def report(self, fraction: float | None, message: str | None) -> None:
        """``report_progress`` from the job's thread: sent now, or with the next beat if one went out just now."""
        with self._lock:
            if self._job is None:
                return
            self._progress = Progress(*self._job, fraction, message)
            if time.monotonic() - self._progress_sent < _PROGRESS_EVERY:
                return
        self._send_progress()

    def _send_progress(self) -> None:
        with self._lock:
            msg, self._progress = self._progress, None
            if msg is None or msg[:2] != self._job:
                return
            self._progress_sent = time.monotonic()
        self.link.send(msg)

    def end_job(self) -> None:
        with self._lock:
            self._job = None

    def run(self) -> None:
        while True:
            with self._lock:
                job, due = self._job, self._next
                self._idle = job is None
            timeout = max(0.0, due - time.monotonic()) if job else None
            ready = wait([self.lifeline, self._wake_r], timeout)
            if self.lifeline in ready:
                _die_with_parent()
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
                continue
            with self._lock:
                if self._job != job or job is None:
                    continue
                self._next = time.monotonic() + self.interval
            # A beat that crosses the job's Result is harmless: the parent
            # matches it against the job it believes runs, and ignores it.
            self._send_progress()
            self.link.send(Beat(*job))


def _cannot_load_here(error: BaseException) -> bool:
    """Whether loading a payload failed because of this process's environment, not because of the job.

    A missing module, a name a module no longer has (pickle's "Can't get
    attribute"), or a pickle made by value on another Python: another
    executor, deployed differently, may well load it.
    """
    if isinstance(error, (ImportError, CannotRunHere)):
        return True
    return isinstance(error, AttributeError) and str(error).startswith("Can't get attribute")


def _load(call: Call, signer: serialization.Signer) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The call a job makes, with the upstream results it takes in place of their references."""
    if call.functions:
        byvalue.register(call.functions)  # before the payload that names them is unpickled
    # With a secret, a payload that fails its signature raises here, before anything is unpickled.
    fn, args, kwargs = serialization.load_payload(call.payload, signer, call.job_id)
    refs = set(serialization.collect_refs(args, kwargs, call.refs))
    if refs:
        missing = sorted(refs - call.inputs.keys())
        if missing:
            raise RuntimeError(f"upstream job(s) {missing} have no stored result")
        # Each result is checked against its own job id before it is unpickled.
        values = {i: serialization.load_result(call.inputs[i], i, signer) for i in refs}
        args, kwargs = serialization.resolve_refs(args, kwargs, values, call.refs)
    return fn, args, kwargs


def _run_one(call: Call, signer: serialization.Signer) -> tuple[bool, bytes, str | None, bool, str | None]:
    """Run one job; return (ok, signed pickle of the result or exception, "Type: message" on failure,
    whether the call was loaded (False if it failed before the function ran), why it was refused)."""
    loaded = False
    try:
        try:
            fn, args, kwargs = _load(call, signer)
        except Exception as error:
            if _cannot_load_here(error):
                why = f"{type(error).__name__}: {error} (on {socket.gethostname()}, Python {sys.version.split()[0]})"
                return False, b"", why, False, why
            raise
        loaded = True
        value = fn(*args, **kwargs)
        return True, serialization.dump_result(value, call.job_id, signer), None, True, None
    except BaseException as error:  # noqa: BLE001 - SystemExit in a job is the job's failure, as in ProcessPoolExecutor
        tb = serialization.format_remote_traceback(error)
        blob = serialization.dump_exception(error, remote_tb=tb, signer=signer)
        return False, blob, serialization.exception_summary(error), loaded, None


def child_main(conn: Connection, lifeline: Connection, config: ChildConfig) -> None:
    """Entry point of a child process (started by :func:`dbexecutor.pool.start_child`)."""
    link = _Link(conn)
    link.start()
    try:
        if config.initializer is not None:
            config.initializer(*config.initargs)
    except BaseException as error:  # noqa: BLE001
        link.send(InitFailed(f"{type(error).__name__}: {error}", serialization.format_remote_traceback(error)))
        return
    beat = _Heartbeat(link, lifeline, config.heartbeat_interval)
    beat.start()
    progress.install(beat.report)
    txns = transactions.ChildTransactions(config.database, config.signer) if config.database is not None else None
    transactions.install(txns)
    link.send(Ready())
    while True:
        call = link.recv()
        if isinstance(call, Stop):
            return
        beat.start_job(call.job_id, call.attempt)
        if txns is not None:
            # An early call's job that opens a transaction first waits for its lease to commit.
            txns.job_started(functools.partial(link.wait_committed, call.job_id, call.attempt) if call.early else None)
        started = time.time()
        ok, blob, summary, loaded, refused = _run_one(call, config.signer)
        finalized = False
        if txns is not None and txns.open:
            # Still beating: the commit may wait a moment for the row's lock.
            ok, blob, summary, finalized = txns.end(call, ok, blob, summary, started)
        beat.end_job()
        link.send(Result(call.job_id, call.attempt, ok, blob, summary, started, time.time(), loaded, refused, finalized))
