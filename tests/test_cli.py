"""The command line against every database: run in the test's process, and once as ``python -m dbexecutor``."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import jobs
from clitools import cli, cli_env, cli_process, run_main
from dbexecutor.cli import parse_duration

T = 60


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _finished_set(db, tmp_path):
    """A done job, a failed one, a dependent that failed because of it, and a keyed job in another group."""
    ex = db.executor(2)
    ok = ex.submit(jobs.add, 1, 2)
    bad = ex.submit(jobs.fail, "exploded")
    dep = ex.submit(jobs.add, ok, bad)
    keyed = ex.options(group="reports", key=f"k-{uuid.uuid4().hex[:6]}").submit(jobs.identity, "x")
    assert ok.result(timeout=T) == 3 and keyed.result(timeout=T) == "x"
    with pytest.raises(Exception):
        dep.result(timeout=T)
    return ex, ok, bad, dep, keyed


def test_status_list_show(db, tmp_path):
    ex, ok, bad, dep, keyed = _finished_set(db, tmp_path)

    status = _json(cli(db, "status", "--json"))
    assert status["states"]["done"] == 2 and status["states"]["failed"] == 2 and status["total"] == 4
    assert status["groups"]["reports"]["done"] == 1 and status["groups"]["default"]["failed"] == 2
    assert status["running"] == [] and status["oldest_ready"] is None
    human = cli(db, "status")
    assert human.returncode == 0 and "reports" in human.stdout and "1/1" in human.stdout and "1/3" in human.stdout

    failed = _json(cli(db, "list", "--state", "failed", "--json"))
    assert [r["id"] for r in failed] == [dep.job_id, bad.job_id]
    assert failed[1]["error"] == "CustomError: exploded"
    assert [r["id"] for r in _json(cli(db, "list", "--function", "fail", "--json"))] == [bad.job_id]
    assert [r["id"] for r in _json(cli(db, "list", "--group", "reports", "--json"))] == [keyed.job_id]
    assert [r["id"] for r in _json(cli(db, "list", "--key", db.row(keyed.job_id).job_key, "--json"))] == [keyed.job_id]
    assert len(_json(cli(db, "list", "--newer-than", "1h", "--json"))) == 4
    nothing = cli(db, "list", "--older-than", "1h")
    assert nothing.returncode == 1 and nothing.stdout.startswith("ID")

    shown = _json(cli(db, "show", str(dep.job_id), "--json"))
    assert shown["function"] == "jobs.add" and shown["state"] == "failed"
    assert [d["id"] for d in shown["depends_on"]] == [ok.job_id, bad.job_id]
    assert "jobs.add" in shown["arguments"]["globals"]
    text = cli(db, "show", str(bad.job_id))
    assert text.returncode == 0
    assert "Traceback (most recent call last)" in text.stdout and "CustomError: exploded" in text.stdout
    assert "'exploded'" in text.stdout  # the argument summary
    assert f"{dep.job_id} (failed)" in text.stdout  # dependents
    assert "exception" in text.stdout  # the attempt's outcome
    missing = cli(db, "show", "987654")
    assert missing.returncode == 1 and "no job with id 987654" in missing.stderr


def test_retry_revives_a_failed_job_and_its_dependents(db, tmp_path):
    marker = str(tmp_path / "marker")
    ex = db.executor(2, retry_delay=0.1)
    up = ex.submit(jobs.fail_first_time, marker, 5)
    mid = ex.submit(jobs.add, up, 1)
    down = ex.submit(jobs.add, mid, 10)
    other = ex.submit(jobs.add, 1, 1)
    for fut in (up, mid, down):
        with pytest.raises(Exception):
            fut.result(timeout=T)
    assert other.result(timeout=T) == 2

    # The dependent alone cannot run while its upstream is failed; a done job cannot be retried.
    refused = cli(db, "retry", str(mid.job_id))
    assert refused.returncode == 1 and f"upstream job {up.job_id} is failed" in refused.stdout
    assert cli(db, "retry", str(other.job_id)).returncode == 1

    out = _json(cli(db, "retry", str(up.job_id), "--retries", "1", "--json"))
    assert out["refused"] == {}
    assert out["revived"] == {str(up.job_id): "ready", str(mid.job_id): "waiting", str(down.job_id): "waiting"}
    assert db.row(up.job_id).retries == 2  # attempt 1 + one more retry
    # Any executor picks them up; fresh futures come from the rows.
    ex2 = db.executor(2)
    assert ex2.future(down.job_id).result(timeout=T) == 16
    assert db.states([up, mid, down]) == {up.job_id: "done", mid.job_id: "done", down.job_id: "done"}
    assert [a.outcome for a in db.attempts(up.job_id)] == ["exception", "ok"]
    assert cli(db, "retry", "--failed").returncode == 1  # nothing failed any more


def test_retry_failed_and_cancel(db, tmp_path):
    ex = db.executor(2)
    bad = ex.submit(jobs.fail_on, 3, 3)
    with pytest.raises(jobs.CustomError):
        bad.result(timeout=T)
    later = ex.options(delay=3600).submit(jobs.add, 1, 2)  # ready, but not before an hour
    child = ex.submit(jobs.add, later, 1)
    cancelled = _json(cli(db, "cancel", str(later.job_id), "--json"))
    assert cancelled["cancelled"] == [later.job_id, child.job_id]
    again = cli(db, "cancel", str(later.job_id))
    assert again.returncode == 1 and "cancelled" in again.stdout
    assert cli(db, "cancel", "987654").returncode == 1

    out = _json(cli(db, "retry", "--failed", "--json"))
    assert out["revived"] == {str(bad.job_id): "ready"}
    # It fails again (same arguments): retried exactly once more, and recorded.
    deadline = time.monotonic() + T
    while db.row(bad.job_id).state != "failed" or len(db.attempts(bad.job_id)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert [a.attempt for a in db.attempts(bad.job_id)] == [1, 2]


def test_watch_migrate_and_exit_codes(db, tmp_path):
    ex = db.executor(1)
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    watch = cli(db, "status", "--watch", "--interval", "0.1", "--count", "2")
    assert watch.returncode == 0 and watch.stdout.count("database ") == 2 and "[####" in watch.stdout

    # Another prefix: no tables (4) until migrate creates them.
    other = type(db)(db.kind, db.url, (db.prefix or "") + "x_")
    try:
        absent = cli(other, "status")
        assert absent.returncode == 4 and "dbexecutor migrate" in absent.stderr
        first = cli(other, "migrate")
        assert first.returncode == 0 and first.stdout.startswith("created the tables"), first.stdout
        assert _json(cli(other, "status", "--json"))["total"] == 0
        again = cli(other, "migrate", "--json")
        assert _json(again)["created_tables"] is False and _json(again)["upgraded_from"] is None
        assert cli(other, "migrate").stdout.endswith("up to date\n")
    finally:
        if db.kind != "sqlite":
            s = other.store()
            s.drop_schema()
            s.close()

    assert run_main("status").returncode == 2  # no URL anywhere
    assert run_main("purge", db.url, "--older-than", "soon").returncode == 2
    assert run_main("frobnicate").returncode == 2
    assert run_main("status", "oracle://x@y/z").returncode == 2
    assert run_main("status", "postgresql://nobody@127.0.0.1:1/x").returncode == 3
    missing = tmp_path / "never-made.db"
    assert run_main("status", f"sqlite:///{missing}").returncode == 4
    assert not missing.exists()  # reading never creates an empty database
    via_env = run_main("status", "--json", "--prefix", db.prefix, env=cli_env(DBEXECUTOR_URL=db.url))
    assert via_env.returncode == 0 and json.loads(via_env.stdout)["total"] == 1


def test_the_entry_point_runs_a_command_and_exits_with_its_status(db):
    """``python -m dbexecutor`` in a fresh interpreter: the URL from the environment, the JSON out, the exit statuses."""
    ex = db.executor(1)
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    via_env = cli_process("status", "--json", "--prefix", db.prefix, env=cli_env(DBEXECUTOR_URL=db.url))
    assert via_env.returncode == 0 and json.loads(via_env.stdout)["total"] == 1
    missing = cli_process("show", "987654", "--url", db.url, "--prefix", db.prefix)
    assert missing.returncode == 1 and "987654" in missing.stderr
    assert cli_process("frobnicate").returncode == 2


def test_parse_duration():
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90 and parse_duration("2.5s") == 2.5 and parse_duration("1w") == 604800
    for bad in ("", "soon", "5x", "d7"):
        with pytest.raises(Exception):
            parse_duration(bad)


def test_group_command_pauses_and_resumes_a_group(db):
    ex = db.executor(1)
    assert cli(db, "group", "--name", "api", "--limit", "0").returncode == 0
    fut = ex.options(group="api").submit(jobs.identity, 5)
    assert ex.submit(jobs.identity, 6).result(timeout=T) == 6  # the executor runs, just not "api"
    assert db.row(fut.job_id).state == "ready"
    assert _json(cli(db, "group", "--name", "api", "--json")) == {"name": "api", "weight": 1, "limit": 0, "vtime": 0.0}
    assert _json(cli(db, "status", "--json"))["group_settings"]["api"] == {"weight": 1, "limit": 0}
    assert cli(db, "group", "--name", "nope").returncode == 1
    assert cli(db, "group", "--name", "api", "--limit", "-2").returncode == 2
    assert cli(db, "group", "--name", "api", "--limit", "none", "--weight", "3").returncode == 0
    assert fut.result(timeout=T) == 5
    assert {g.name: (g.weight, g.limit) for g in ex.groups()}["api"] == (3, None)
