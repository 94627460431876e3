"""A job's own retry_delay decides its backoff, wherever it is retried."""

from __future__ import annotations

import time

import jobs

T = 60


def test_a_job_backs_off_by_its_own_delay_not_the_executors(db, tmp_path):
    # The executor's default would hold the retry back for a minute.
    ex = db.executor(1, retry_delay=60.0)
    marker = str(tmp_path / "failed-once")
    quick = ex.options(retries=1, retry_delay=0.05).submit(jobs.fail_first_time, marker, "second try")
    started = time.monotonic()
    assert quick.result(timeout=T) == "second try"
    assert time.monotonic() - started < 30
    row = db.row(quick.job_id)
    assert (row.attempt, row.retry_delay) == (2, 0.05)
    first, second = db.attempts(quick.job_id)
    assert (first.outcome, second.outcome) == ("exception", "ok")


def test_without_one_the_executors_default_is_stored_with_the_job(db, tmp_path):
    ex = db.executor(1, retry_delay=45.0)
    marker = str(tmp_path / "failed-once")
    slow = ex.options(retries=1).submit(jobs.fail_first_time, marker, "later")
    deadline = time.monotonic() + T
    while db.row(slow.job_id).attempt < 1 or db.row(slow.job_id).state != "ready":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    row = db.row(slow.job_id)
    assert row.retry_delay == 45.0
    # Backed off by about 45 s (exponential in the attempt, +/-25% jitter).
    assert 45.0 * 0.75 - 1 <= row.run_after - time.time() <= 45.0 * 1.25
    slow.cancel()
