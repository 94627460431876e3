"""What runs inside a child process: one job at a time, a heartbeat beside it.

::

    parent ◄──("ready",)─────────────────── started, initializer done
    parent ──(job_id, attempt, payload)──► main thread: load payload, fetch
                                           upstream results, run fn, pickle
           ◄──("result", ...)───────────── the outcome (never writes the row)
                                           heartbeat thread: renew the lease
                                           via this child's own connection;
                                           exit if the parent's lifeline closes

The parent finalizes; the child only renews the lease of the attempt it runs,
guarded by the attempt token, so a child that lost its lease changes nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import psutil

from . import serialization
from .store import Store

log = logging.getLogger("dbexecutor.child")

# First renewal soon after a job starts, so that the row says "running"
# while a long job runs; jobs shorter than this go from leased to done.
_RUNNING_MARK_DELAY = 0.1


class _Heartbeat(threading.Thread):
    """Renews the current job's lease; ends the whole child if the parent dies."""

    def __init__(self, store: Store, lifeline: Connection, interval: float, ttl: float) -> None:
        super().__init__(name="dbexecutor-heartbeat", daemon=True)
        self.store, self.lifeline, self.interval, self.ttl = store, lifeline, interval, ttl
        self._lock = threading.Lock()
        self._job: tuple[int, int] | None = None
        self._next = 0.0
        self._wake_r, self._wake_w = os.pipe()

    def start_job(self, job_id: int, attempt: int) -> None:
        with self._lock:
            self._job = (job_id, attempt)
            self._next = time.monotonic() + min(_RUNNING_MARK_DELAY, self.interval)
        os.write(self._wake_w, b"x")

    def end_job(self) -> None:
        with self._lock:
            self._job = None

    def run(self) -> None:
        while True:
            with self._lock:
                job, due = self._job, self._next
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
            try:
                if not self.store.heartbeat(job[0], job[1], self.ttl, time.time()):
                    log.warning("job %d attempt %d lost its lease; its result will be discarded", *job)
            except Exception:  # the database may be restarting: keep trying at the next beat
                log.warning("heartbeat for job %d attempt %d failed", *job, exc_info=True)


def _die_with_parent() -> None:
    """The parent is gone: take the job's own subprocesses down too, then exit."""
    try:
        for proc in psutil.Process().children(recursive=True):
            proc.kill()
    except psutil.Error:
        pass
    os._exit(70)


def _run_one(store: Store, payload: bytes, job_id: int = 0) -> tuple[bool, bytes, str | None]:
    """Run one job; return (ok, pickled result or exception, "Type: message" on failure)."""
    signer = store.signer
    try:
        # With a secret, a payload that fails its signature raises here, before anything is unpickled.
        fn, args, kwargs = serialization.load_payload(payload, signer, job_id)
        refs = serialization.collect_refs(args, kwargs)
        if refs:
            blobs = store.results(refs)
            missing = sorted(set(refs) - set(blobs))
            if missing:
                raise RuntimeError(f"upstream job(s) {missing} have no stored result")
            args, kwargs = serialization.resolve_refs(
                args, kwargs, {i: serialization.load_result(b, i, signer) for i, b in blobs.items()}
            )
        value = fn(*args, **kwargs)
        return True, serialization.dump_result(value, job_id, signer), None
    except BaseException as error:  # noqa: BLE001 - SystemExit in a job is the job's failure, as in ProcessPoolExecutor
        tb = serialization.format_remote_traceback(error)
        return False, serialization.dump_exception(error, remote_tb=tb, signer=signer), f"{type(error).__name__}: {error}"


def child_main(
    conn: Connection,
    lifeline: Connection,
    url: str,
    prefix: str,
    heartbeat_interval: float,
    lease_ttl: float,
    initializer: Callable[..., Any] | None,
    initargs: tuple[Any, ...],
    signer: serialization.Signer | None = None,
) -> None:
    """Entry point of a child process (started by the parent's pool)."""
    try:
        store = Store(url, prefix, create=False, pool_size=1, signer=signer)
        if initializer is not None:
            initializer(*initargs)
    except BaseException as error:  # noqa: BLE001
        conn.send(("init_error", f"{type(error).__name__}: {error}", serialization.format_remote_traceback(error)))
        return
    beat = _Heartbeat(store, lifeline, heartbeat_interval, lease_ttl)
    beat.start()
    # From here on this child's heartbeat renews the lease of the job it runs.
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed our pipe or died
        if msg is None:
            store.close()
            return
        job_id, attempt, payload = msg
        beat.start_job(job_id, attempt)
        started = time.time()
        ok, blob, summary = _run_one(store, payload, job_id)
        beat.end_job()
        conn.send(("result", job_id, attempt, ok, blob, summary, started, time.time()))
