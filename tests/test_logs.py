"""Logs that help an operator: failed jobs at WARNING, deployment failures at ERROR, a dead child, a worker's start and stop."""

from __future__ import annotations

import logging
import subprocess
import sys
import types

import pytest

import jobs
from clitools import cli_env, read, stop, wait_for_log
from dbexecutor import PayloadRejected, WorkerDied, serialization
from dbexecutor.records import NewJob

T = 60


def _lines(caplog, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def _wait_logged(caplog, logger: str, level: int, text: str) -> str:
    import time

    end = time.monotonic() + T
    while True:
        found = [m for m in _lines(caplog, logger, level) if text in m]
        if found:
            return found[0]
        assert time.monotonic() < end, f"{text!r} not logged: {[r.getMessage() for r in caplog.records]}"
        time.sleep(0.05)


def test_every_failed_attempt_is_a_warning_with_id_function_attempt_and_the_exception(db, caplog):
    caplog.set_level(logging.INFO, logger="dbexecutor")
    ex = db.executor(1, retry_delay=0.05)
    fut = ex.options(retries=1).submit(jobs.fail, "boom\nsecond line")
    with pytest.raises(jobs.CustomError):
        fut.result(timeout=T)
    failures = [m for m in _lines(caplog, "dbexecutor.jobs", logging.WARNING) if f"job {fut.job_id} " in m]
    assert failures == [
        f"job {fut.job_id} (jobs.fail) attempt 1 failed: CustomError: boom second line",
        f"job {fut.job_id} (jobs.fail) attempt 2 failed: CustomError: boom second line",
    ]
    assert any(f"job {fut.job_id} failed and will be retried" in m for m in _lines(caplog, "dbexecutor", logging.INFO))


def test_a_dead_child_is_a_warning(db, caplog):
    caplog.set_level(logging.INFO, logger="dbexecutor")
    ex = db.executor(1)
    fut = ex.submit(jobs.exit_now, 3)
    assert isinstance(fut.exception(timeout=T), WorkerDied)
    line = _wait_logged(caplog, "dbexecutor.jobs", logging.WARNING, "died")
    assert f"job {fut.job_id} (jobs.exit_now) attempt 1" in line and "exit code 3" in line


def test_a_job_that_cannot_be_imported_here_is_refused_and_logged(db, caplog):
    caplog.set_level(logging.INFO, logger="dbexecutor")
    # A function of a module this process has and the children do not: a deployment that forgot code.
    ghost = types.ModuleType("ghost_module_of_test_logs")

    def vanish() -> None:
        pass

    vanish.__module__ = ghost.__name__
    vanish.__qualname__ = "vanish"
    ghost.vanish = vanish  # type: ignore[attr-defined]
    sys.modules[ghost.__name__] = ghost
    try:
        payload = serialization.dump_payload(vanish, (), {})
    finally:
        del sys.modules[ghost.__name__]
    store = db.store()
    try:
        (row,) = store.insert_jobs([NewJob(f"{ghost.__name__}.vanish", payload, ())], store.now())
    finally:
        store.close()
    db.executor(1)
    # Another executor, deployed with that module, may run it: the job goes back, and the refusal is logged.
    line = _wait_logged(caplog, "dbexecutor.jobs", logging.ERROR, f"job {row.job_id} ")
    assert "could not be loaded here" in line and "ModuleNotFoundError" in line and "importable" in line
    assert [a.outcome for a in db.attempts(row.job_id)] == ["refused"]
    assert db.row(row.job_id).state == "ready"


def test_a_rejected_payload_is_an_error(db, caplog):
    caplog.set_level(logging.INFO, logger="dbexecutor")
    unsigned = db.executor(1, run_jobs=False)  # submits without a secret
    job_id = unsigned.submit(jobs.add, 1, 2).job_id
    ex = db.executor(1, secret="the right secret")
    assert isinstance(ex.future(job_id).exception(timeout=T), PayloadRejected)
    line = _wait_logged(caplog, "dbexecutor.jobs", logging.ERROR, f"job {job_id} ")
    assert "(jobs.add) attempt 1 could not be loaded" in line and "PayloadRejected" in line


@pytest.mark.databases("sqlite")
def test_a_worker_logs_its_start_stop_and_failures_at_its_default_level(db, tmp_path):
    log = str(tmp_path / "worker.log")
    db.store().close()
    with open(log, "ab") as out:
        # No --log-level: the default (INFO) shows start, stop and every failed job.
        w = subprocess.Popen([sys.executable, "-m", "dbexecutor", "worker", db.url, "--max-workers", "1", "--poll-interval", "0.05"],
                             stdout=out, stderr=subprocess.STDOUT, env=cli_env())
    try:
        wait_for_log(log, "serving", w)
        ex = db.executor(1, run_jobs=False)
        fut = ex.submit(jobs.fail, "seen by the operator")
        with pytest.raises(jobs.CustomError):
            fut.result(timeout=T)
        wait_for_log(log, "failed: CustomError: seen by the operator", w)
        assert stop(w) == 0
    finally:
        if w.poll() is None:
            w.kill()
    text = read(log)
    assert " INFO dbexecutor.worker" in text and "serving" in text and "stopped" in text
    assert " WARNING dbexecutor.jobs[" in text and f"job {fut.job_id} (jobs.fail) attempt 1 failed" in text
    assert "Traceback" not in text
