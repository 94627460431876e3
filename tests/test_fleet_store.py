"""The registry of executors in the store: register, beat, list, rescue the jobs of the dead, forget them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sqlalchemy import update

from dbexecutor import hosts, schema
from dbexecutor.records import NewJob, Registration

TTL = 30.0


def _registration(pid: int, started: float | None, name: str | None = None) -> Registration:
    return Registration(
        name or hosts.owner_name(pid), "executor", hosts.hostname(), pid, started, "test", 2, None
    )


def _dead_process() -> tuple[int, float | None]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = hosts.process_started(proc.pid)
    proc.wait()
    return proc.pid, started


def test_a_live_executor_is_listed_with_the_jobs_it_holds(db, store):
    me = _registration(os.getpid(), hosts.process_started())
    store.register(me, TTL)
    store.insert_jobs([NewJob("tests.f", b"x", ()) for _ in range(3)], store.now())
    claimed = store.claim(me.name, 2, TTL, store.now())
    assert len(claimed) == 2
    lost = store.beat(me, [(c.job_id, c.attempt) for c in claimed], {claimed[0].job_id}, TTL).lost
    assert lost == set()
    (info,) = store.executors()
    assert (info.name, info.alive, info.running, info.kind, info.slots) == (me.name, True, 2, "executor", 2)
    assert info.rescue_in is None and info.since_beat < 5
    assert store.rescue_dead_here() == {}


def test_the_jobs_of_an_executor_whose_process_is_gone_are_rescued_at_once(db, store):
    pid, started = _dead_process()
    dead = _registration(pid, started)
    store.register(dead, TTL)
    store.insert_jobs([NewJob("tests.f", b"x", ()) for _ in range(2)], store.now())
    held = store.claim(dead.name, 2, TTL, store.now())
    (info,) = store.executors()
    assert (info.alive, info.running, info.rescue_in) == (False, 2, 0.0)  # its lease has not run out: its pid has
    rescued = store.rescue_dead_here()
    assert rescued == {dead.name: sorted(c.job_id for c in held)}
    rows = {r.id: r for r in db.jobs()}
    assert all((rows[c.job_id].state, rows[c.job_id].lease_owner) == (schema.READY, None) for c in held)
    assert [a.outcome for a in db.attempts()] == ["executor died"] * 2
    (info,) = store.executors()
    assert (info.alive, info.running, info.rescue_in) == (False, 0, None) and info.stopped_at is not None
    assert store.rescue_dead_here() == {}  # once


def test_a_reused_pid_is_not_mistaken_for_the_executor(db, store):
    me = os.getpid()
    impostor = _registration(me, (hosts.process_started(me) or 0.0) - 3600)  # "this pid, started an hour earlier"
    store.register(impostor, TTL)
    assert store.rescue_dead_here() == {impostor.name: []}


def test_on_another_host_only_the_lapsed_beat_tells(db, store):
    far = Registration("elsewhere:123:abc", "worker", "elsewhere", 123, 1.0, "test", 4, None)
    store.register(far, TTL)
    assert store.rescue_dead_here() == {}
    (info,) = store.executors()
    assert info.alive
    e = store.tables.executors
    with store.engine.begin() as conn:
        conn.execute(update(e).values(expires=store.now() - 1))
    (info,) = store.executors()
    assert not info.alive and info.rescue_in is None  # holds nothing


def test_dead_registrations_are_forgotten_after_a_while(db, store):
    pid, started = _dead_process()
    gone = _registration(pid, started)
    store.register(gone, TTL)
    store.unregister(gone.name)
    assert store.forget_dead(keep=3600) == 0  # stopped a moment ago: kept for operators
    time.sleep(0.05)
    assert store.forget_dead(keep=0.0) == 1
    assert store.executors() == []


def test_a_forgotten_executor_registers_again_when_it_beats(db, store):
    me = _registration(1, None, name="host:1:again")
    store.register(me, TTL)
    e = store.tables.executors
    with store.engine.begin() as conn:
        conn.execute(e.delete())
    assert store.beat(me, [], set(), TTL).lost == set()
    assert [i.name for i in store.executors()] == [me.name]
