"""Child processes, one at a time: start one, describe how it ended, kill its process tree.

Children are plain ``multiprocessing`` processes the scheduler starts itself,
not a wrapped ``ProcessPoolExecutor``: one dead child costs one job, never the
pool. Each child gets a duplex pipe for messages (:mod:`dbexecutor.messages`)
and a one-way "lifeline" pipe that the parent never writes to: when the
parent dies the lifeline closes and the child ends itself.

The policy (which child gets which job, timeouts, leases) is the
:class:`~dbexecutor.supervisor.Supervisor`'s.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

import psutil

from .child import child_main
from .messages import ChildConfig

__all__ = [
    "Assignment", "Child", "Inbox", "start_child", "kill_trees", "describe_exit", "default_context", "default_workers",
    "warm_up",
]

_GONE_POLL = 0.01  # seconds between looks while a killed tree exits


def default_context() -> BaseContext:
    """``forkserver`` where available, else ``spawn``: the parent has threads, so plain fork is unsafe."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


#: What the fork server imports once, so that every child it forks has it already: the
#: child's module and what it imports (about 0.1 s per child otherwise; no database code).
FORKSERVER_PRELOAD = ("__main__", "dbexecutor.child")

#: ``dbexecutor.forkmain.ENV``: which script the fork server loads (not imported from there: importing
#: that module runs its preload).
FORKSERVER_MAIN_ENV = "DBEXECUTOR_FORKSERVER_MAIN"


def warm_up(ctx: BaseContext) -> None:
    """Start ``ctx``'s fork server now, if it has one, preloading the child's code and the program's script.

    The fork server is a fresh interpreter (and, with it, multiprocessing's
    resource tracker); a child forked from it without the preload imported
    ``dbexecutor.child`` itself before its first job, and the program's
    main script (see :mod:`dbexecutor.forkmain`). Both are done once,
    while the parent connects and claims. A fork server that some other
    code of this process started already is used as it is.

    For a script, the server's environment carries the script's path while
    it starts: call this before starting threads of one's own that read the
    environment (a database driver connecting does), since setting a variable
    while another thread reads them is not safe in C.
    """
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    # The module's one fork server, and what it preloads (private attributes, read
    # with defaults: at worst the preload is skipped and children import the code).
    server = forkserver._forkserver
    main = None
    if getattr(server, "_forkserver_pid", 0) is None:  # not started yet: the preload still counts
        wanted = list(dict.fromkeys([*getattr(server, "_preload_modules", []), *FORKSERVER_PRELOAD]))
        main = _main_script()
        if main is not None:
            wanted.append("dbexecutor.forkmain")  # after dbexecutor.child: a failing script leaves that loaded
        ctx.set_forkserver_preload(wanted)
    if main is None:
        forkserver.ensure_running()
        return
    # The server inherits this environment when it starts (see dbexecutor.forkmain).
    os.environ[FORKSERVER_MAIN_ENV] = json.dumps(main)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(FORKSERVER_MAIN_ENV, None)


def _main_script() -> dict[str, Any] | None:
    """The program's main script as multiprocessing's children find it (path, ``sys.argv``, ``sys.path``), or None.

    None for a program whose main module is imported by name in children or
    not at all (``python -m``, ``python -c``, the ``dbexecutor`` command, a
    notebook).
    """
    from multiprocessing import spawn

    data = spawn.get_preparation_data("ignore")
    path = data.get("init_main_from_path")
    if not path:
        return None
    return {"path": path, "argv": list(data.get("sys_argv", [])), "sys_path": list(data.get("sys_path", sys.path))}


def importing_main() -> bool:
    """Whether this process is a child still importing the main module of the program that started it.

    multiprocessing's ``spawn`` and ``forkserver`` children import the
    parent's main module before they run anything else: a script that starts
    an executor when imported (no ``if __name__ == "__main__":``) starts one
    again in each of its children.
    """
    # multiprocessing's own check (spawn._check_not_importing_main) reads this flag.
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


#: Why a child cannot start an executor while importing its parent's main module.
IMPORTING_MAIN = (
    "a DBExecutor was created while this child process was importing the main module of the program "
    "that started it, which starts one when imported. Put the script's work under "
    "`if __name__ == \"__main__\":` (as ProcessPoolExecutor needs with spawn or forkserver): "
    "children import the script first."
)


def default_workers() -> int:
    """The number of CPUs this process may use (as ``ProcessPoolExecutor``'s default)."""
    count = getattr(os, "process_cpu_count", os.cpu_count)()
    return count or 1


@dataclass(slots=True)
class Assignment:
    """A claimed job handed to a child: ``attempt`` is its lease token (not frozen: one per job, see :mod:`~dbexecutor.records`)."""

    job_id: int
    attempt: int
    timeout: float | None
    retry_delay: float  # the backoff base if this attempt fails and may be retried
    function: str = ""  # the job's function, for log lines
    uncommitted: bool = False  # dispatched early: the transaction that leased it has not committed yet
    awaits_commit: bool = False  # its child asked to be told when it has (AwaitCommit)

    @property
    def lease(self) -> tuple[int, int]:
        """``(job_id, attempt)``: what guards every write for this attempt."""
        return (self.job_id, self.attempt)


class Inbox:
    """The parent's reader of a child's pipe: every whole message that has arrived, for one system call.

    ``Connection.recv`` costs a poll and two reads per message; short jobs
    prefetched many to a child answer with many small messages. This reads
    what the pipe holds and cuts it into messages itself, in the framing of
    ``multiprocessing.connection`` (a 4-byte big-endian length, or -1 and an
    8-byte one; then the pickle), so the child sends with ``Connection.send``
    unchanged. Only this object may read the pipe: a partial message waits
    here for the rest.
    """

    _CHUNK = 1 << 16

    def __init__(self, conn: Connection) -> None:
        self._fd = conn.fileno()
        self._buf = bytearray()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)

    def read(self) -> list[Any]:
        """The messages that have arrived whole; [] if none. Raises EOFError once the child's end is closed.

        A message that has begun to arrive is read to its end, waiting for
        the rest as ``Connection.recv`` does (its sender is writing it).
        """
        if not self._poll.poll(0):
            return []
        out: list[Any] = []
        want = self._CHUNK
        while want > 0:
            data = os.read(self._fd, want)
            if not data:
                if out:  # deliver what came whole first; the end of file is seen at the next read
                    return out
                raise EOFError("the child closed its pipe")
            self._buf += data
            want = self._parse(out)
        return out

    def _parse(self, out: list[Any]) -> int:
        """Move the whole messages in the buffer to ``out``; the bytes a partial one still lacks (0: none)."""
        buf, at = self._buf, 0
        missing = 0
        while len(buf) - at >= 4:
            size, head = struct.unpack_from("!i", buf, at)[0], 4
            if size == -1:  # a message of 2 GiB or more
                if len(buf) - at < 12:
                    missing = 12 - (len(buf) - at)
                    break
                size, head = struct.unpack_from("!Q", buf, at + 4)[0], 12
            if len(buf) - at - head < size:
                missing = size - (len(buf) - at - head)
                break
            out.append(pickle.loads(buf[at + head : at + head + size]))
            at += head + size
        else:
            missing = 4 - (len(buf) - at) if len(buf) > at else 0
        del buf[:at]
        return missing


@dataclass(eq=False)
class Child:
    """One child process and the jobs it has been handed (the first one is running, once it is ready)."""

    process: Any  # multiprocessing.Process from the chosen context
    conn: Connection
    lifeline: Connection  # the write end, kept open while the parent lives
    queue: deque[Assignment] = field(default_factory=deque)
    started_at: float = 0.0  # wall clock when the first job in the queue started
    started_mono: float = 0.0  # the same, monotonic, for the timeout
    tasks: int = 0
    ready: bool = False  # started, initializer done: it runs (and beats for) the head of its queue
    heard: float = field(default_factory=time.monotonic)  # monotonic time of its last message
    beat: tuple[int, int] | None = None  # the attempt its last beat was for
    functions: set[str] = field(default_factory=set)  # digests of the stored functions it has been sent
    inbox: Inbox = field(init=False)  # the only reader of ``conn``

    def __post_init__(self) -> None:
        self.inbox = Inbox(self.conn)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return int(self.process.pid)

    @property
    def job(self) -> Assignment | None:
        """The job running now (or next, while the child starts), if any."""
        return self.queue[0] if self.queue else None

    @property
    def busy(self) -> bool:
        """Whether it holds a job."""
        return bool(self.queue)

    @property
    def running(self) -> Assignment | None:
        """The job it is running now: the head of its queue, once it is ready."""
        return self.queue[0] if self.queue and self.ready else None

    @property
    def deadline(self) -> float | None:
        """Monotonic time past which the running job is killed."""
        head = self.running
        if head is None or not head.timeout:
            return None  # a child still starting up is not running the job yet
        return self.started_mono + head.timeout

    def head_started(self) -> None:
        """The child has begun the first job of its queue (it runs them in order, back to back)."""
        self.started_at, self.started_mono = time.time(), time.monotonic()

    def close(self) -> None:
        """Close the parent's ends of the pipes (the child sees EOF if it still lives)."""
        for conn in (self.conn, self.lifeline):
            try:
                conn.close()
            except OSError:
                pass


def start_child(ctx: BaseContext, config: ChildConfig) -> Child:
    """Start a child process that waits for jobs on its pipe."""
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    life_r, life_w = ctx.Pipe(duplex=False)
    process = ctx.Process(  # type: ignore[attr-defined]
        target=child_main, args=(child_conn, life_r, config), name="dbexecutor-child", daemon=True
    )
    process.start()
    # The child has its own copies now; closing ours makes EOF mean "the other side died".
    child_conn.close()
    life_r.close()
    return Child(process, parent_conn, life_w)


def kill_trees(pids: Iterable[int], grace: float = 1.0) -> None:
    """Terminate each of ``pids`` with every descendant, then kill whatever outlives ``grace`` seconds.

    All trees at once: killing several costs one grace period, not one each.
    """
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            pass
    _send(procs, psutil.Process.terminate)
    alive = _wait_gone(procs, grace)
    _send(alive, psutil.Process.kill)
    _wait_gone(alive, grace)


def _send(procs: list[psutil.Process], how: Any) -> None:
    for proc in procs:
        try:
            how(proc)
        except psutil.NoSuchProcess:
            pass


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
