"""The command line's operator commands (issue 19): workers, health, bulk retry and cancel, group lists, throughput, one set of JSON names.

Commands run in this process through ``cli.main`` (``clitools.cli``, what
the console script calls), which spares an interpreter start per command;
``test_cli.py`` runs the entry point itself once as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import jobs
from clitools import cli, cli_env
from dbexecutor import hosts
from dbexecutor.records import NewJob, Registration

T = 60
_COLUMN_NAMES = {"group_key", "fn_name", "job_key", "lease_owner"}


def _json(proc: Any) -> Any:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def _me(kind: str = "worker", slots: int = 4) -> Registration:
    return Registration(hosts.owner_name(), kind, hosts.hostname(), os.getpid(), hosts.process_started(), "test", slots)


def test_workers_lists_the_registry(db):
    store = db.store()
    try:
        assert cli(db, "workers").returncode == 1  # nobody registered
        me = _me()
        gone = Registration("far:1:abc", "executor", "far", 1, 1.0, "test", 2)
        store.register(me, 30.0)
        store.register(gone, 30.0)
        store.unregister(gone.name)
        # Killed without unregistering, on another host: its registration lapses after its TTL.
        lapsed = Registration("far:2:def", "worker", "far", 2, 1.0, "test", 1)
        store.register(lapsed, 0.0)
        listed = _json(cli(db, "workers", "--json"))
        assert [(w["name"], w["alive"], w["kind"], w["slots"], w["running"]) for w in listed] == [(me.name, True, "worker", 4, 0)]
        assert {"host", "pid", "age", "last_beat", "since_beat", "started_at"} <= set(listed[0])
        every = _json(cli(db, "workers", "--all", "--json"))
        assert {w["name"]: w["alive"] for w in every} == {me.name: True, gone.name: False, lapsed.name: False}
        text = cli(db, "workers", "--all").stdout
        assert "alive" in text and "stopped" in text and hosts.hostname() in text
        (line,) = [row for row in text.splitlines() if row.startswith(lapsed.name)]
        assert line.rstrip().endswith("dead"), line
        # Dead registrations are forgotten once they are old enough.
        assert store.forget_dead(keep=0.0) == 2
        assert {w["name"] for w in _json(cli(db, "workers", "--all", "--json"))} == {me.name}
    finally:
        store.close()


def test_health_exit_codes(db, tmp_path):
    store = db.store()
    try:
        healthy = cli(db, "health")
        assert healthy.returncode == 0 and healthy.stdout.startswith("ok:"), healthy.stderr
        store.insert_jobs([NewJob("tests.f", b"x", (), group="api")], store.now())
        starved = cli(db, "health", "--json")
        assert starved.returncode == 5, starved.stderr
        data = json.loads(starved.stdout)
        assert data["starved"] == ["api"] and data["ok"] is False and data["schema_current"] is True
        assert "no live worker" in starved.stderr
        store.configure_group("api", limit=0)
        assert cli(db, "health").returncode == 0  # paused: nobody is expected to run it
        store.configure_group("api", limit=None)
        store.register(_me(), 30.0)
        assert _json(cli(db, "health", "--json"))["workers_alive"] == 1
        meta = store.tables.meta
        with store.engine.begin() as conn:
            conn.execute(meta.update().where(meta.c.name == "schema_version").values(value="3"))
        old = cli(db, "health")
        assert old.returncode == 4 and "dbexecutor migrate" in old.stderr
    finally:
        store.close()
    other = type(db)(db.kind, db.url, (db.prefix or "") + "none_")
    if db.kind == "sqlite":
        other = type(db)(db.kind, f"sqlite:///{tmp_path / 'absent.db'}", "")
    assert cli(other, "health").returncode == 4
    down = subprocess.run([sys.executable, "-m", "dbexecutor", "health", "postgresql://nobody@127.0.0.1:1/x"],
                          capture_output=True, text=True, env=cli_env(), timeout=T)
    assert down.returncode == 3


def test_bulk_retry_and_cancel_by_filters(db):
    ex = db.executor(2)
    bulk = [ex.options(group="bulk").submit(jobs.fail_on, i, i) for i in range(4)]
    other = ex.submit(jobs.fail, "kept")
    for f in bulk + [other]:
        with pytest.raises(jobs.CustomError):
            f.result(timeout=T)
    out = _json(cli(db, "retry", "--group", "bulk", "--json"))  # --group alone means its failed jobs
    assert sorted(int(i) for i in out["revived"]) == sorted(f.job_id for f in bulk) and out["refused"] == {}
    assert db.row(other.job_id).state == "failed"
    for f in bulk:
        ex.future(f.job_id).exception(timeout=T)
    out = _json(cli(db, "retry", "--function", "jobs.fail", "--state", "failed", "--json"))
    assert set(out["revived"]) == {str(other.job_id)} | {str(f.job_id) for f in bulk}  # "jobs.fail" is in jobs.fail_on too
    assert cli(db, "retry", "1", "--group", "bulk").returncode == 2  # ids or filters
    assert cli(db, "retry").returncode == 2
    later = [ex.options(group="later", delay=3600).submit(jobs.add, i, 1) for i in range(3)]
    keep = ex.options(delay=3600).submit(jobs.add, 0, 0)
    ex.flush()
    assert cli(db, "cancel", "--state", "running", "--group", "later").returncode == 2  # needs --running
    out = _json(cli(db, "cancel", "--group", "later", "--json"))
    assert out == {"cancelled": sorted(f.job_id for f in later), "terminating": [], "not_cancelled": {}}
    assert db.row(keep.job_id).state == "ready"
    nothing = cli(db, "cancel", "--group", "later")
    assert nothing.returncode == 1 and "no job matches" in nothing.stdout


def test_group_without_a_name_lists_the_groups(db):
    ex = db.executor(1)
    ex.configure_group("api", limit=0)
    ex.configure_group("ingest", weight=3)
    assert ex.options(group="ingest").submit(jobs.add, 1, 1).result(timeout=T) == 2
    ex.options(group="api").submit(jobs.add, 1, 1)
    ex.flush()
    listed = {g["name"]: g for g in _json(cli(db, "group", "--json"))}
    assert set(listed) == {"default", "api", "ingest"}
    assert listed["api"]["paused"] is True and listed["api"]["jobs"]["ready"] == 1
    assert listed["ingest"]["weight"] == 3 and listed["ingest"]["jobs"]["done"] == 1
    text = cli(db, "group").stdout
    assert "paused" in text and "ingest" in text
    assert cli(db, "group", "--weight", "2").returncode == 2  # a change needs --name


def test_status_shows_throughput_and_an_eta(db):
    ex = db.executor(2)
    assert [f.result(timeout=T) for f in [ex.submit(jobs.add, i, 0) for i in range(6)]] == list(range(6))
    ex.options(delay=3600).submit(jobs.add, 0, 0)
    ex.flush()
    watch = cli(db, "status", "--watch", "--interval", "0.1", "--count", "2")
    assert watch.returncode == 0 and watch.stdout.count("jobs/s over the last 5 min") == 2
    assert "6 done" in watch.stdout and "1 queued, ETA " in watch.stdout and "ETA -" not in watch.stdout
    data = _json(cli(db, "status", "--json"))
    assert data["queued"] == 1 and data["eta"] > 0 and data["throughput"]["done"][-1] == 6


def _keys(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def test_every_json_output_uses_one_set_of_names(db):
    ex = db.executor(2)
    bad = ex.options(group="g", key=f"k-{db.prefix}").submit(jobs.fail, "x")
    with pytest.raises(jobs.CustomError):
        bad.result(timeout=T)
    later = ex.options(delay=3600).submit(jobs.add, 1, 1)
    ex.flush()
    store = db.store()
    store.register(_me(), 30.0)
    store.close()
    outputs = [
        ("status",), ("list",), ("show", str(bad.job_id)), ("group",), ("group", "--name", "g"), ("workers",),
        ("health",), ("cancel", str(later.job_id)), ("retry", str(bad.job_id)), ("purge", "--older-than", "7d"), ("migrate",),
    ]
    seen: set[str] = set()
    for args in outputs:
        proc = cli(db, *args, "--json")
        assert proc.returncode in (0, 1), (args, proc.stderr)
        found = _keys(json.loads(proc.stdout))
        assert not found & _COLUMN_NAMES, (args, found & _COLUMN_NAMES)
        seen |= found
    assert {"id", "state", "group", "function", "key", "worker", "attempt"} <= seen
