"""Children that never touch the database: what travels over the pipe, and the leases the parent keeps.

A child imports neither SQLAlchemy nor the executor; the results a job takes
as arguments travel with it; the parent renews the leases of all its
children (a row says running once its job has run for a moment, a job longer
than its lease keeps it); an executor's connections do not grow with its
children; a child whose parent is gone exits without a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
from sqlalchemy import text, update

import jobs
from seams import scheduler_of
from clitools import cli_env
from test_faults import DRIVER, _kill, _tail, _warm_up

T = 60
SECRET = "correct horse battery staple"
# The dbexecutor modules a child may import: the child's own, and what it needs to check and
# load pickles. Not the records (the read models' dataclasses cost 20 ms to build).
CHILD_MODULES = {
    "dbexecutor", "dbexecutor.child", "dbexecutor.errors", "dbexecutor.messages", "dbexecutor.serialization",
    "dbexecutor.progress", "dbexecutor.transactions", "dbexecutor.byvalue",
}


# -- a child imports no database code ---------------------------------------------------


def test_a_child_imports_neither_sqlalchemy_nor_the_executor(db):
    ex = db.executor(2)
    sqlalchemy_here, modules = ex.submit(jobs.modules_seen).result(timeout=T)
    assert not sqlalchemy_here, modules
    assert set(modules) <= CHILD_MODULES, sorted(set(modules) - CHILD_MODULES)
    # A chunked map runs its chunks through a helper of the child's own, not the executor's.
    for sqlalchemy_here, modules in ex.map(jobs.modules_seen, range(4), chunksize=2):
        assert not sqlalchemy_here and set(modules) <= CHILD_MODULES, modules


# -- upstream results travel with the job ------------------------------------------------------


def test_upstream_results_reach_the_child_with_the_job(db):
    ex = db.executor(2, secret=SECRET)  # signed: the child checks each result it is handed
    a = ex.submit(jobs.add, 1, 2)
    chain = ex.submit(jobs.add, a, 10)
    c = ex.submit(jobs.add, chain, 100)  # a chain of three, each taking the one before
    fan_in = ex.submit(jobs.total_here, a, c, k=chain)  # three upstreams, one of them by keyword
    in_a_list = ex.submit(jobs.sum_list, [a, c])
    ordering_only = ex.submit(jobs.total_here, 5, after=[fan_in])
    assert c.result(timeout=T) == 113
    # Computed in a child that never imported SQLAlchemy: its inputs came with the job.
    assert fan_in.result(timeout=T) == (3 + 113 + 13, False)
    assert in_a_list.result(timeout=T) == 116
    assert ordering_only.result(timeout=T) == (5, False)
    rows = {r.id: r for r in db.jobs()}
    assert rows[fan_in.job_id].arg_refs is not None


def test_a_chain_link_takes_its_input_from_the_commit_that_recorded_it(db, monkeypatch):
    """The result a tick just recorded goes to the dependent that tick claimed without being read back."""
    ex = db.executor(1)
    store = scheduler_of(ex).store
    asked: list[int] = []
    read = store.results

    def counted(job_ids):
        asked.extend(job_ids)
        return read(job_ids)

    monkeypatch.setattr(store, "results", counted)
    links = [ex.submit(jobs.add, 0, 1)]
    for _ in range(9):
        links.append(ex.submit(jobs.add, links[-1], 1))
    assert links[-1].result(timeout=T) == 10
    # Each link's upstream finished in the commit that claimed the link (one worker,
    # nothing else to run), so at most a straggler was read from the table.
    upstream = {f.job_id for f in links[:-1]}
    assert len(upstream & set(asked)) <= 2, asked


def test_a_row_without_recorded_refs_still_gets_its_inputs(db):
    """Rows written before schema 3 have ``arg_refs`` NULL: the child is handed every done upstream's result."""
    ex = db.executor(2)
    a, b = ex.submit(jobs.add, 1, 1), ex.submit(jobs.add, 2, 2)
    assert (a.result(timeout=T), b.result(timeout=T)) == (2, 4)
    ex.configure_group("held", limit=0)  # written, but nobody may claim it yet
    c = ex.options(group="held").submit(jobs.total_here, a, k=b)
    d = ex.options(group="held").submit(jobs.total_here, 7, after=[a])
    ex.flush()
    store = db.store()
    try:
        j = store.tables.jobs
        with store.engine.begin() as conn:
            conn.execute(update(j).where(j.c.id.in_([c.job_id, d.job_id])).values(arg_refs=None))
    finally:
        store.close()
    assert db.row(c.job_id).arg_refs is None and db.row(d.job_id).state == "ready"
    ex.configure_group("held", limit=None)
    assert c.result(timeout=T) == (6, False)
    assert d.result(timeout=T) == (7, False)


# -- leases the parent keeps ----------------------------------------------------------------------


def test_a_running_job_is_marked_running_soon_after_it_starts(db, tmp_path):
    # Renewals every 30 s: the row says running well before that, because
    # the job's first beat (a moment after it starts) makes the parent mark it.
    ex = db.executor(1, lease_ttl=120.0, heartbeat_interval=30.0)
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    gate = str(tmp_path / "gate")
    fut = ex.submit(jobs.wait_for_file, gate, "held")
    try:
        end = time.monotonic() + 15
        while db.row(fut.job_id).state != "running":
            assert time.monotonic() < end, db.row(fut.job_id).state
            time.sleep(0.05)
    finally:
        open(gate, "w").close()
    assert fut.result(timeout=T) == "held"


def test_a_job_longer_than_its_lease_keeps_it(db):
    ex = db.executor(1, lease_ttl=1.5, heartbeat_interval=0.25)
    _warm_up(ex, 1)
    fut = ex.submit(jobs.sleep, 4.0, "kept")
    assert fut.result(timeout=T) == "kept"
    assert [(a.attempt, a.outcome) for a in db.attempts(fut.job_id)] == [(1, "ok")]


# -- connections per executor --------------------------------------------------------------------------


_SERVER_PORT = {"postgresql": 5432, "mariadb": 3306}


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def _sqlite_handles(proc: psutil.Process, path: str) -> int:
    try:
        return sum(1 for f in proc.open_files() if f.path == path)
    except psutil.Error:
        return 0


def _server_ports(proc: psutil.Process, port: int) -> set[int]:
    try:
        conns = proc.net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def _sessions_from(db, ports: set[int]) -> int:
    """How many sessions the server itself sees from these client ports."""
    store = db.store()
    try:
        with store.engine.connect() as conn:
            if db.kind == "postgresql":
                rows = conn.execute(text("SELECT client_port FROM pg_stat_activity WHERE client_port IS NOT NULL")).all()
                seen = [int(r[0]) for r in rows]
            else:
                rows = conn.execute(text("SELECT host FROM information_schema.processlist")).all()
                seen = [int(r[0].rsplit(":", 1)[1]) for r in rows if r[0] and ":" in r[0]]
    finally:
        store.close()
    return sum(1 for p in seen if p in ports)


def _connections_while_running(db, tmp_path, workers: int) -> tuple[int, int]:
    """Run ``workers`` jobs at once in an executor of its own process; its connections, and its children's."""
    started = tmp_path / f"started-{workers}"
    started.mkdir()
    gate = str(tmp_path / f"gate-{workers}")
    options = {**db.options, "max_workers": workers}
    log = str(tmp_path / f"hold-{workers}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, DRIVER, "hold", db.url, json.dumps(options), str(workers), gate, str(started)],
            stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp_path), env=cli_env(),
        )
    try:
        end = time.monotonic() + 90
        while len(os.listdir(started)) < workers:
            assert proc.poll() is None, _tail(log)
            assert time.monotonic() < end, f"only {len(os.listdir(started))} of {workers} jobs started:\n{_tail(log)}"
            time.sleep(0.05)
        executor, *children = _tree(proc.pid)
        if db.kind == "sqlite":
            path = os.path.realpath(db.url.removeprefix("sqlite:///"))
            mine, theirs = _sqlite_handles(executor, path), sum(_sqlite_handles(c, path) for c in children)
        else:
            port = _SERVER_PORT[db.kind]
            ports = _server_ports(executor, port)
            theirs = sum(len(_server_ports(c, port)) for c in children)
            mine = len(ports)
            assert _sessions_from(db, ports) == mine, "the server does not see these connections"
        open(gate, "w").close()
        assert proc.wait(90) == 0, _tail(log)
    finally:
        open(gate, "a").close()
        _kill(proc)
    return mine, theirs


def test_connections_do_not_grow_with_the_children(db, tmp_path):
    few = _connections_while_running(db, tmp_path, 2)
    many = _connections_while_running(db, tmp_path, 8)
    assert few[1] == many[1] == 0, "a child holds a database connection"
    assert 1 <= many[0] <= 3, many
    assert many[0] == few[0], (few, many)


# -- a child whose parent is gone ------------------------------------------------------------------------


def test_a_child_whose_parent_stops_reading_exits_quietly(tmp_path):
    """Its result cannot be delivered (a broken pipe): the child exits at once, with no traceback."""
    script = tmp_path / "orphan.py"
    script.write_text(textwrap.dedent(
        """
        import multiprocessing, os, socket, sys
        import jobs
        from dbexecutor import serialization
        from dbexecutor.messages import Call, ChildConfig, Ready
        from dbexecutor.pool import start_child

        if __name__ == "__main__":
            ctx = multiprocessing.get_context("forkserver")
            child = start_child(ctx, ChildConfig(0.05, None, (), serialization.UNSIGNED))
            assert isinstance(child.conn.recv(), Ready)
            payload = serialization.dump_payload(jobs.sleep, (0.5, "x"), {})
            child.conn.send(Call(1, 1, payload, {}))
            # The parent stops reading, as a dead one would, but keeps the lifeline
            # open: the child learns it only when its Result finds a broken pipe.
            socket.socket(fileno=os.dup(child.conn.fileno())).shutdown(socket.SHUT_RD)
            child.process.join(30)
            print("EXIT", child.process.exitcode, flush=True)
        """
    ))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=cli_env())
    assert "EXIT 70" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr, proc.stderr


def test_jobs_sent_together_run_in_order_each_with_its_result(tmp_path):
    """The parent hands a child the jobs of one tick in one ``Calls`` message: each runs, in order, and has its Result."""
    script = tmp_path / "calls.py"
    script.write_text(textwrap.dedent(
        """
        import multiprocessing, pickle
        import jobs
        from dbexecutor import serialization
        from dbexecutor.messages import Call, Calls, ChildConfig, Ready, Result, Stop
        from dbexecutor.pool import start_child

        if __name__ == "__main__":
            child = start_child(multiprocessing.get_context("forkserver"), ChildConfig(1.0, None, (), serialization.UNSIGNED))
            assert isinstance(child.conn.recv(), Ready)
            calls = [Call(i, 1, serialization.dump_payload(jobs.add, (i, 100), {}), {}) for i in range(1, 6)]
            calls.append(Call(6, 2, serialization.dump_payload(jobs.fail, ("six",), {}), {}))
            child.conn.send(Calls(tuple(calls)))
            got = []
            while len(got) < 6:
                msg = child.conn.recv()
                if isinstance(msg, Result):
                    got.append(msg)
            print("IDS", [(r.job_id, r.attempt, r.ok) for r in got], flush=True)
            print("VALUES", [serialization.load_result(r.blob, r.job_id, serialization.UNSIGNED) for r in got[:5]], flush=True)
            child.conn.send(Stop())
            child.process.join(30)
            print("EXIT", child.process.exitcode, flush=True)
        """
    ))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=cli_env())
    assert "IDS [(1, 1, True), (2, 1, True), (3, 1, True), (4, 1, True), (5, 1, True), (6, 2, False)]" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert "VALUES [101, 102, 103, 104, 105]" in proc.stdout, proc.stdout + proc.stderr
    assert "EXIT 0" in proc.stdout, proc.stdout + proc.stderr


def test_a_long_job_is_beaten_for_after_short_ones_and_after_an_idle_spell(tmp_path):
    """The heartbeat thread is woken by a job only when it waits without a deadline (idle).

    Between jobs that follow each other it waits for the previous job's
    due time and reads the job again: a long job that follows short ones
    still gets its beats, and so does one that follows an idle spell.
    """
    script = tmp_path / "beats.py"
    script.write_text(textwrap.dedent(
        """
        import multiprocessing, time
        import jobs
        from dbexecutor import serialization
        from dbexecutor.messages import Beat, Call, Calls, ChildConfig, Ready, Result, Stop
        from dbexecutor.pool import start_child

        def until_result(child, job_id, beats):
            while True:
                msg = child.conn.recv()
                if isinstance(msg, Beat):
                    beats.append(msg[0])
                if isinstance(msg, Result) and msg.job_id == job_id:
                    return

        if __name__ == "__main__":
            child = start_child(multiprocessing.get_context("forkserver"), ChildConfig(0.2, None, (), serialization.UNSIGNED))
            assert isinstance(child.conn.recv(), Ready)
            beats = []
            short = [Call(i, 1, serialization.dump_payload(jobs.add, (i, 1), {}), {}) for i in (1, 2, 3)]
            long = Call(4, 1, serialization.dump_payload(jobs.sleep, (0.7,), {}), {})
            child.conn.send(Calls((*short, long)))
            until_result(child, 4, beats)
            time.sleep(0.5)  # idle: the heartbeat thread waits without a deadline
            child.conn.send(Call(5, 1, serialization.dump_payload(jobs.sleep, (0.7,), {}), {}))
            until_result(child, 5, beats)
            print("BEATS", sorted(set(beats)), beats.count(4) >= 2, beats.count(5) >= 2, flush=True)
            child.conn.send(Stop())
            child.process.join(30)
        """
    ))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=cli_env())
    # Beats every 0.2 s while a 0.7 s job runs (the first 0.1 s in); none for jobs of a millisecond.
    assert "BEATS [4, 5] True True" in proc.stdout, proc.stdout + proc.stderr


def test_stop_message_ends_an_idle_child(tmp_path):
    script = tmp_path / "stop.py"
    script.write_text(textwrap.dedent(
        """
        import multiprocessing
        from dbexecutor import serialization
        from dbexecutor.messages import ChildConfig, Ready, Stop
        from dbexecutor.pool import start_child

        if __name__ == "__main__":
            child = start_child(multiprocessing.get_context("spawn"), ChildConfig(1.0, None, (), serialization.UNSIGNED))
            assert isinstance(child.conn.recv(), Ready)
            child.conn.send(Stop())
            child.process.join(30)
            print("EXIT", child.process.exitcode, flush=True)
        """
    ))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=cli_env())
    assert "EXIT 0" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_the_parents_inbox_reads_what_connection_send_wrote():
    """``pool.Inbox`` cuts the pipe's bytes into the messages ``Connection.send`` framed: many small, one large, then EOF."""
    import multiprocessing
    import select
    import threading

    from dbexecutor.pool import Inbox

    ours, theirs = multiprocessing.Pipe()
    inbox = Inbox(ours)
    sent = [("beat", i) for i in range(1000)] + [b"r" * 3_000_000, ("after", 1)]

    def send() -> None:
        for msg in sent:
            theirs.send(msg)
        theirs.close()

    sender = threading.Thread(target=send)
    sender.start()
    got: list = inbox.read()  # whatever has arrived so far; never waits for more
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        select.select([ours], [], [], 1.0)
        try:
            got += inbox.read()
        except EOFError:
            break
    sender.join(10)
    assert got == sent
