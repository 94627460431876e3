"""Starting, watching and killing the child processes (parent side).

Children are plain ``multiprocessing`` processes the scheduler starts itself,
not a wrapped ``ProcessPoolExecutor``: one dead child costs one job, never the
pool. Each child gets a duplex pipe for jobs and results, and a one-way
"lifeline" pipe that the parent never writes to: when the parent dies the
lifeline closes and the child's heartbeat thread ends the child.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, Callable

import psutil

from .child import child_main

__all__ = ["Assignment", "Child", "start_child", "kill_tree", "describe_exit", "default_context"]

_GONE_POLL = 0.01  # seconds between looks while a killed tree exits


def default_context() -> BaseContext:
    """``forkserver`` where available, else ``spawn``: the parent has threads, so plain fork is unsafe."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


@dataclass(frozen=True)
class Assignment:
    """A claimed job handed to a child: ``attempt`` is its lease token."""

    job_id: int
    attempt: int
    timeout: float | None
    retry_delay: float  # the backoff base if this attempt fails and may be retried


@dataclass(eq=False)
class Child:
    """One child process and the jobs it has been handed (the first one is running)."""

    process: Any  # multiprocessing.Process from the chosen context
    conn: Connection
    lifeline: Connection  # the write end, kept open while the parent lives
    queue: deque[Assignment] = field(default_factory=deque)
    started_at: float = 0.0  # wall clock when the first job in the queue started
    started_mono: float = 0.0  # the same, monotonic, for the timeout
    tasks: int = 0
    ready: bool = False  # started, initializer done: its heartbeat covers the job it runs

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def job(self) -> Assignment | None:
        """The job running now, if any."""
        return self.queue[0] if self.queue else None

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    @property
    def deadline(self) -> float | None:
        """Monotonic time past which the running job is killed."""
        head = self.job
        if head is None or not head.timeout or not self.ready:
            return None  # a child still starting up is not running the job yet
        return self.started_mono + head.timeout

    def head_started(self) -> None:
        """The child has begun the first job of its queue (it runs them in order, back to back)."""
        self.started_at, self.started_mono = time.time(), time.monotonic()


def start_child(
    ctx: BaseContext,
    url: str,
    prefix: str,
    heartbeat_interval: float,
    lease_ttl: float,
    initializer: Callable[..., Any] | None,
    initargs: tuple[Any, ...],
    signer: Any = None,
) -> Child:
    """Start a child process that waits for jobs on its pipe (``signer``: the executor's ``Signer``)."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    life_r, life_w = ctx.Pipe(duplex=False)
    process = ctx.Process(  # type: ignore[attr-defined]
        target=child_main,
        args=(child_conn, life_r, url, prefix, heartbeat_interval, lease_ttl, initializer, initargs, signer),
        name="dbexecutor-child",
        daemon=True,
    )
    process.start()
    # The child has its own copies now; closing ours makes EOF mean "the other side died".
    child_conn.close()
    life_r.close()
    return Child(process, parent_conn, life_w)


def kill_tree(pid: int, grace: float = 1.0) -> None:
    """Terminate ``pid`` and every descendant, then kill whatever outlives ``grace`` seconds."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    alive = _wait_gone(procs, grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_gone(alive, grace)


def _gone(proc: psutil.Process) -> bool:
    # A zombie has ended; only its parent can reap it, and an orphaned
    # grandchild's new parent may never do so (a container's init, say).
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has ended (or is a zombie); return those still alive after ``timeout``."""
    end = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < end:
        time.sleep(_GONE_POLL)
        alive = [p for p in alive if not _gone(p)]
    return alive


def describe_exit(exitcode: int | None) -> str:
    """``signal 9 (SIGKILL)`` or ``exit code 3``: how a child ended, for errors and attempts."""
    if exitcode is None:
        return "unknown exit"
    if exitcode < 0:
        try:
            return f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"
