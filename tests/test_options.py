"""Input checks: a URL is required, durations are read as the CLI reads them, option names are checked."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest

import jobs
from dbexecutor import ConfigurationError, DBExecutor, JobOptions
from dbexecutor.durations import DurationError, parse_duration, seconds

T = 60


# -- the URL ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [None, 42, b"sqlite:///jobs.db"])
def test_a_url_string_is_required(url):
    with pytest.raises(TypeError, match=r"needs a database URL string.*sqlite:///jobs\.db") as info:
        DBExecutor(url)
    assert repr(url) in str(info.value)


def test_a_path_gets_a_hint(tmp_path):
    path = tmp_path / "jobs.db"
    with pytest.raises(TypeError, match=f"sqlite:///{path}"):
        DBExecutor(path)  # type: ignore[arg-type]
    assert not path.exists()


# -- durations --------------------------------------------------------------------------------


def test_durations_parse_like_the_command_line():
    for text, expected in [("90", 90), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("7d", 604800),
                           ("2w", 1209600), ("2.5s", 2.5), (" 1h 30m ", 5400), ("1H", 3600)]:
        assert parse_duration(text) == expected, text
    for value, expected in [(5, 5.0), (2.5, 2.5), (timedelta(minutes=2), 120.0), ("2m", 120.0), (None, None)]:
        assert seconds(value, "x") == expected
    for bad in ("", "soon", "5x", "d7", "-5s", "1h-30m"):
        with pytest.raises(DurationError, match="not a duration"):
            parse_duration(bad)
    # A ConfigurationError, so a ValueError, for the API.
    with pytest.raises(ConfigurationError, match=r"^delay: not a duration: '5x'"):
        seconds("5x", "delay")
    for bad in (True, [5], object()):
        with pytest.raises(TypeError, match="timeout must be a number of seconds, a duration string"):
            seconds(bad, "timeout")


def test_job_options_take_durations():
    opts = JobOptions(timeout="30m", retry_delay=timedelta(seconds=3), delay="1h30m")
    assert (opts.timeout, opts.retry_delay, opts.delay) == (1800.0, 3.0, 5400.0)
    assert all(type(v) is float for v in (opts.timeout, opts.retry_delay, opts.delay))
    with pytest.raises(ValueError, match="retry_delay must be"):
        JobOptions(retry_delay=-1)
    with pytest.raises(ValueError, match="retry_delay must be"):
        JobOptions(retry_delay=math.inf)


def test_per_job_durations_reach_the_row(db):
    ex = db.executor()
    before = time.time()
    held = ex.options(delay="1h", timeout="30m").submit(jobs.identity, 1)
    quick = ex.options(delay=timedelta(0), timeout=timedelta(minutes=2)).submit(jobs.identity, 2)
    assert quick.result(timeout=T) == 2
    row = db.row(held.job_id)
    assert row.state == "ready" and row.timeout == 1800.0
    # Stored on the database server's clock (within its resolution: SQLite reads milliseconds).
    assert before + 3600 - 0.01 <= row.run_after <= time.time() + 3600 + 0.01
    assert db.row(quick.job_id).timeout == 120.0
    assert held.cancel()


def test_bad_per_job_durations_are_refused_with_the_option_name(db):
    ex = db.executor()
    with pytest.raises(ValueError, match=r"^delay: not a duration: '5 minutes'"):
        ex.options(delay="5 minutes")
    with pytest.raises(TypeError, match="^timeout must be"):
        ex.options(timeout=[1])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        ex.options(timeout="0s")
    assert db.counts() == {}


def test_executor_durations(db):
    ex = db.executor(
        lease_ttl="1m", heartbeat_interval=timedelta(seconds=5), timeout="1h", retry_delay="2s",
        poll_interval="0.05", retention="7d",
    )
    s = ex._scheduler.s
    assert (s.lease_ttl, s.heartbeat_interval, s.timeout, s.retry_delay, s.poll_interval, s.retention) == (
        60.0, 5.0, 3600.0, 2.0, 0.05, 604800.0,
    )
    fut = ex.submit(jobs.identity, 3)
    assert fut.result(timeout=T) == 3
    assert db.row(fut.job_id).timeout == 3600.0  # the executor's default timeout is the job's


@pytest.mark.parametrize(
    "option, value, error, message",
    [
        ("lease_ttl", "soon", ValueError, "lease_ttl: not a duration"),
        ("lease_ttl", None, TypeError, "lease_ttl must be a duration"),
        ("lease_ttl", "0s", ValueError, "lease_ttl must be > 0"),
        ("heartbeat_interval", "1h", ValueError, "shorter than lease_ttl"),
        ("poll_interval", [1], TypeError, "poll_interval must be a number of seconds"),
        ("retry_delay", "-1s", ValueError, "retry_delay: not a duration"),
        ("timeout", "x", ValueError, "timeout: not a duration"),
        ("retention", "0d", ValueError, "retention must be a positive duration"),
    ],
)
def test_bad_executor_durations(db, option, value, error, message):
    with pytest.raises(error, match=message):
        DBExecutor(db.url, 1, **{**db.options, option: value})
    assert db.counts() == {}


# -- option names -----------------------------------------------------------------------------


def test_retry_delay_is_a_per_job_option(db, monkeypatch):
    ex = db.executor()
    written = []
    enqueue_many = ex._scheduler.enqueue_many
    monkeypatch.setattr(ex._scheduler, "enqueue_many", lambda rows: written.extend(rows) or enqueue_many(rows))
    assert ex.options(retry_delay=1, retries=2).submit(jobs.identity, 1).result(timeout=T) == 1
    assert ex.options(retry_delay="1m").options(timeout=5).submit(jobs.identity, 2).result(timeout=T) == 2
    assert ex.submit(jobs.identity, 3).result(timeout=T) == 3
    # The executor's own retry_delay is every job's default, like timeout and retries.
    assert [(j.retry_delay, j.retries, j.timeout) for j in written] == [(1.0, 2, None), (60.0, 0, 5.0), (1.0, 0, None)]


def test_an_unknown_option_lists_the_valid_names(db):
    ex = db.executor()
    with pytest.raises(TypeError) as info:
        ex.options(retry_dleay=1)
    message = str(info.value)
    assert "unknown job option 'retry_dleay'" in message
    for name in ("key", "group", "weight", "priority", "timeout", "retries", "retry_delay", "delay", "run_after"):
        assert name in message
    with pytest.raises(TypeError, match="unknown job options 'a', 'b'; the options are key, group"):
        ex.options(group="g").options(a=1, b=2)
    assert db.counts() == {}

