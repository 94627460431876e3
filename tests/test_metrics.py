"""Prometheus metrics, parsed from the exposition: the database's gauges, and a worker's own counters that move."""

from __future__ import annotations

import time
import urllib.request

import pytest

import jobs
from clitools import read, start_worker, stop, wait_for_log
from dbexecutor.records import Report
from dbexecutor.stats import CLAIM_BUCKETS, SchedulerStats
from uitools import free_port

parser = pytest.importorskip("prometheus_client.parser")
T = 60


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: ``(name, sorted labels) -> value``."""
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_database_gauges_follow_the_jobs(db):
    from dbexecutor import metrics

    ex = db.executor(2)
    assert [f.result(timeout=T) for f in [ex.options(group="m").submit(jobs.add, i, 1) for i in range(3)]] == [1, 2, 3]
    store = db.store()
    try:
        reg = metrics.registry(store)
        first = _samples(metrics.exposition(reg).decode())
        assert first[("dbexecutor_database_up", ())] == 1
        assert first[("dbexecutor_jobs", (("group", "m"), ("state", "done")))] == 3
        assert first[("dbexecutor_jobs", (("group", "m"), ("state", "failed")))] == 0
        assert first[("dbexecutor_finished_last_minute", (("state", "done"),))] == 3
        assert ("dbexecutor_workers_alive", ()) in first and ("dbexecutor_oldest_ready_age_seconds", ()) in first
        with pytest.raises(jobs.CustomError):
            ex.options(group="m").submit(jobs.fail, "x").result(timeout=T)
        ex.options(group="m", delay=3600).submit(jobs.add, 0, 0)
        ex.flush()
        then = _samples(metrics.exposition(reg).decode())
        assert then[("dbexecutor_jobs", (("group", "m"), ("state", "failed")))] == 1
        assert then[("dbexecutor_jobs", (("group", "m"), ("state", "ready")))] == 1
        assert then[("dbexecutor_finished_last_minute", (("state", "failed"),))] == 1
    finally:
        store.close()


def _scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return _samples(r.read().decode())


def test_a_worker_serves_its_counters(db, tmp_path):
    log = str(tmp_path / "worker.log")
    port = free_port()
    w = start_worker(db, log, "--max-workers", "2", "--metrics-port", str(port))
    try:
        wait_for_log(log, "serving", w)
        wait_for_log(log, f"metrics at http://127.0.0.1:{port}/metrics", w)
        before = _scrape(port)
        assert before[("dbexecutor_job_starts_total", ())] == 0
        ex = db.executor(2, run_jobs=False)
        ok = [ex.submit(jobs.add, i, i) for i in range(5)]
        bad = ex.submit(jobs.fail, "counted")
        assert [f.result(timeout=T) for f in ok] == [0, 2, 4, 6, 8]
        with pytest.raises(jobs.CustomError):
            bad.result(timeout=T)
        end = time.monotonic() + T
        while True:  # the counters move once the outcomes are written, a moment after the futures resolve
            after = _scrape(port)
            if after[("dbexecutor_job_finishes_total", (("outcome", "ok"),))] >= 5 and after.get(("dbexecutor_job_failures_total", ()), 0) >= 1:
                break
            assert time.monotonic() < end, after
            time.sleep(0.1)
        assert after[("dbexecutor_job_starts_total", ())] == 6
        assert after[("dbexecutor_job_finishes_total", (("outcome", "exception"),))] == 1
        assert after[("dbexecutor_claim_latency_seconds_count", ())] >= 1
        assert after[("dbexecutor_claim_latency_seconds_bucket", (("le", "+Inf"),))] == after[("dbexecutor_claim_latency_seconds_count", ())]
        assert after[("dbexecutor_lease_rescues_total", ())] == 0
        assert after[("dbexecutor_jobs", (("group", "default"), ("state", "done")))] == 5
        assert stop(w) == 0
    finally:
        if w.poll() is None:
            w.kill()


def test_a_worker_refuses_a_metrics_port_it_cannot_serve(db, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        log = str(tmp_path / "w.log")
        w = start_worker(db, log, "--metrics-port", str(taken.getsockname()[1]))
        assert w.wait(T) == 2, read(log)
    assert "cannot serve metrics" in read(log)


def test_scheduler_stats_count_outcomes_and_bucket_latency():
    stats = SchedulerStats()
    stats.started(3)
    stats.ended([Report(1, 1, True, b"", "ok"), Report(2, 1, False, b"", "exception"),
                 Report(3, 1, False, b"", "signal 9 (SIGKILL)"), Report(4, 1, False, b"", "terminated")])
    for seconds in (0.0005, 0.02, 20.0):
        stats.claimed(seconds)
    stats.rescued(2)
    snap = stats.snapshot()
    assert snap.started == 3 and snap.ended == {"ok": 1, "exception": 1, "died": 1, "terminated": 1}
    assert snap.failures == 2 and snap.rescued == 2 and snap.claims == 3
    assert snap.claim_buckets[0] == 1 and snap.claim_buckets[CLAIM_BUCKETS.index(0.025)] == 2 and snap.claim_buckets[-1] == 2
