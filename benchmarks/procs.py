"""Plumbing for the scenarios that need other processes or plain SQL (benchmark code, not library code).

- ``env()``: the environment a subprocess needs to import the same ``dbexecutor``
  and ``benchmarks`` as this process (``benchmarks/ab.py`` points
  ``PYTHONPATH`` at another revision's ``src``; subprocesses must follow).
- ``Worker``: a real ``python -m dbexecutor worker URL ...`` subprocess
  (optionally wrapped by ``benchmarks.sqltrace``, which counts and times its SQL).
- ``fresh_python()``: run a snippet in a new interpreter and read the JSON it prints.
- ``engine()`` and the queries on the jobs tables: plain SQLAlchemy on the same
  database, never the library's ``Store``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy
from sqlalchemy import text

import dbexecutor

ROOT = Path(__file__).resolve().parent.parent


def library_dir() -> str:
    """The directory holding the ``dbexecutor`` package this process imported (a ``src`` folder)."""
    return str(Path(dbexecutor.__file__).resolve().parent.parent)


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    paths = [library_dir(), str(ROOT)] + ([out["PYTHONPATH"]] if out.get("PYTHONPATH") else [])
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    out.update(extra)
    return out


def sa_url(url: str) -> str:
    """The SQLAlchemy URL for a dbexecutor URL (``postgresql://`` means psycopg 3, ``mysql://`` PyMySQL)."""
    for scheme, driver in (("postgresql://", "postgresql+psycopg://"), ("postgres://", "postgresql+psycopg://"),
                           ("mysql://", "mysql+pymysql://"), ("mariadb://", "mysql+pymysql://")):
        if url.startswith(scheme):
            return driver + url[len(scheme):]
    return url


def engine(url: str, **options: Any) -> sqlalchemy.Engine:
    if url.startswith("sqlite"):
        options.setdefault("connect_args", {"timeout": 30.0})
    return sqlalchemy.create_engine(sa_url(url), **options)


def kind_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else ("postgresql" if url.startswith("postgres") else "mariadb")


# -- reading the jobs tables --------------------------------------------------------


def job_times(eng: sqlalchemy.Engine, prefix: str) -> dict[str, Any]:
    """Counts per state and the wall-clock bounds of the done jobs (``finished_at``, ``created_at``)."""
    with eng.connect() as conn:
        states = dict(conn.execute(text(f"SELECT state, count(*) FROM {prefix}jobs GROUP BY state")).all())
        row = conn.execute(text(
            f"SELECT min(created_at), max(created_at), min(finished_at), max(finished_at) "
            f"FROM {prefix}jobs WHERE state = 'done'")).one()
    return {"states": {k: int(v) for k, v in states.items()}, "first_created": row[0], "last_created": row[1],
            "first_done": row[2], "last_done": row[3]}


def wait_done(eng: sqlalchemy.Engine, prefix: str, n: int, limit: float, interval: float = 0.05) -> dict[str, Any]:
    """Poll until ``n`` jobs are finished (done, failed or cancelled); their times."""
    end = time.monotonic() + limit
    while True:
        got = job_times(eng, prefix)
        finished = sum(got["states"].get(s, 0) for s in ("done", "failed", "cancelled"))
        if finished >= n:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"{finished} of {n} jobs finished after {limit:g} s: {got['states']}")
        time.sleep(interval)


def drop_tables(eng: sqlalchemy.Engine, names: list[str]) -> None:
    with eng.begin() as conn:
        for name in names:
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


# -- subprocesses ---------------------------------------------------------------------


class Worker:
    """A ``dbexecutor worker`` subprocess; ``started`` is the wall clock just before it was started."""

    def __init__(self, url: str, prefix: str, slots: int, *extra: str, trace: str | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="dbexecutor-bench-worker-", suffix=".log", delete=False)
        argv = ["-m", "dbexecutor", "worker", url, "--prefix", prefix, "--max-workers", str(slots),
                "--path", str(ROOT), "--grace", "10", *extra]
        if trace is not None:
            argv = ["-m", "benchmarks.sqltrace", trace, "--", *argv[2:]]
        self.started = time.time()
        self.process = subprocess.Popen([sys.executable, *argv], env=env(), cwd=str(ROOT),
                                        stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_serving(self, limit: float = 60.0) -> float:
        """Wait for the worker's "serving" log line; the wall clock when it was seen."""
        end = time.monotonic() + limit
        while "serving" not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.process.returncode}:\n{self.output()[-2000:]}")
            if time.monotonic() > end:
                raise TimeoutError(f"the worker did not start within {limit:g} s:\n{self.output()[-2000:]}")
            time.sleep(0.01)
        return time.time()

    def stop(self, limit: float = 30.0) -> int | None:
        """SIGTERM, then wait (a kill of the whole tree after ``limit``); its exit code. Idempotent."""
        if self.log.closed:
            return self.process.returncode
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(limit)
            except subprocess.TimeoutExpired:
                kill_tree(self.process.pid)
                self.process.wait(10)
        self.log.close()
        code = self.process.returncode
        if code not in (0, -signal.SIGTERM):
            print(f"    worker {self.pid} exited with {code}:\n{self.output()[-1500:]}", flush=True)
        os.unlink(self.log.name)
        return code


def stop_all(workers: list[Worker]) -> None:
    for w in workers:  # the signal to all first, so they stop side by side
        if w.process.poll() is None:
            w.process.send_signal(signal.SIGTERM)
    for w in workers:
        w.stop()


def kill_tree(pid: int) -> None:
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def fresh_python(code: str, limit: float = 120.0) -> dict[str, Any]:
    """Run ``code`` in a new interpreter (``python -c``); the JSON object on its last stdout line."""
    out = subprocess.run([sys.executable, "-c", code], env=env(), cwd=str(ROOT), capture_output=True,
                         text=True, timeout=limit)
    if out.returncode != 0:
        raise RuntimeError(f"python -c exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def migrate(url: str, prefix: str) -> None:
    """Create the tables with the command line, as an operator would."""
    out = subprocess.run([sys.executable, "-m", "dbexecutor", "migrate", url, "--prefix", prefix], env=env(),
                         cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"dbexecutor migrate exited with {out.returncode}: {out.stderr[-2000:]}")


def tree_pids(pid: int) -> set[int]:
    try:
        p = psutil.Process(pid)
        return {pid} | {c.pid for c in p.children(recursive=True)}
    except psutil.Error:
        return set()


#: The names of a local database server's processes (the postmaster and a backend per connection; one mariadbd).
SERVER_PROCESSES = {"postgresql": ("postgres",), "mariadb": ("mariadbd", "mysqld")}


def cpu_seconds(kind: str) -> dict[str, float]:
    """CPU seconds (user + system) so far of this process, of its descendants, and of the local ``kind`` server.

    The servers here are on loopback, so their processes are this machine's;
    SQLite has no server (its work is this process's). A process that ends
    between two readings takes its seconds with it: read around work whose
    processes stay (an executor's children, a server's backends).
    """
    def used(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    me = psutil.Process()
    out = {"parent": used(me), "children": 0.0, "server": 0.0}
    for child in me.children(recursive=True):
        try:
            out["children"] += used(child)
        except psutil.Error:
            continue
    names = SERVER_PROCESSES.get(kind, ())
    if names:
        for p in psutil.process_iter(["name"]):
            try:
                if p.info["name"] in names:
                    out["server"] += used(p)
            except psutil.Error:
                continue
    return out


def tcp_ports(pids: set[int], server_port: int) -> set[int]:
    """Local ports of the TCP connections these processes hold to ``server_port`` (on loopback)."""
    ports = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.raddr and c.raddr.port == server_port and c.status == psutil.CONN_ESTABLISHED:
                ports.add(c.laddr.port)
    return ports


def open_handles(pids: set[int], path: str) -> int:
    """How many file descriptors of these processes are open on ``path`` (an SQLite database's connections)."""
    real = os.path.realpath(path)
    n = 0
    for pid in pids:
        try:
            n += sum(1 for f in psutil.Process(pid).open_files() if os.path.realpath(f.path) == real)
        except psutil.Error:
            continue
    return n
