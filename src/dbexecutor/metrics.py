"""Prometheus metrics: what the database holds, and what one worker did.

::

    GET /metrics of `dbexecutor ui`          the database's view, read at each scrape:
                                             jobs by state and group, live executors,
                                             finishes in the last minute, queue age
    GET /metrics of `dbexecutor worker       the same, plus this worker's counters:
        --metrics-port N`                    starts, ended attempts by outcome, failures,
                                             claim latency, lease rescues

The database's view is gauges (a purge makes counts fall, so they are not
counters); a worker's own activity is counters, since its start, as
Prometheus expects. Needs ``prometheus_client``: ``pip install
'dbexecutor[metrics]'`` (the ``ui`` extra brings it too).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from .stats import CLAIM_BUCKETS, SchedulerStats

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from .store import Store

__all__ = ["available", "registry", "exposition", "serve", "CONTENT_TYPE"]

#: The media type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def available() -> bool:
    """Whether ``prometheus_client`` is installed."""
    return importlib.util.find_spec("prometheus_client") is not None


class _DatabaseCollector:
    """Gauges read from the database at each scrape (one overview transaction)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("dbexecutor_database_up", "1 if the last scrape could read the database, else 0")
        try:
            view = self.store.console.overview(running_limit=0)
        except DBAPIError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("dbexecutor_jobs", "Jobs in the database, by state and group", labels=["state", "group"])
        for group, counts in sorted(view.status.groups.items()):
            for state, n in counts.as_dict().items():
                jobs.add_metric([state, group], n)
        yield jobs
        alive = GaugeMetricFamily("dbexecutor_workers_alive", "Registered executors and workers that run jobs and beat")
        alive.add_metric([], view.workers_alive)
        yield alive
        finished = GaugeMetricFamily(
            "dbexecutor_finished_last_minute", "Jobs that finished in the last minute, by final state", labels=["state"]
        )
        flow = view.throughput
        for state, series in (("done", flow.done), ("failed", flow.failed), ("cancelled", flow.cancelled)):
            finished.add_metric([state], series[-1] if series else 0)
        yield finished
        oldest = GaugeMetricFamily("dbexecutor_oldest_ready_age_seconds", "How long the oldest ready job has waited (0: none)")
        oldest.add_metric([], 0.0 if view.status.oldest_ready is None else view.status.oldest_ready.age)
        yield oldest


class _StatsCollector:
    """Counters of one worker's scheduler, since it started."""

    def __init__(self, stats: SchedulerStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        snap = self.stats.snapshot()
        started = CounterMetricFamily("dbexecutor_job_starts", "Jobs this worker claimed to run")
        started.add_metric([], snap.started)
        yield started
        ended = CounterMetricFamily(
            "dbexecutor_job_finishes", "Attempts this worker ran that ended, by outcome "
            "(ok, exception, timeout, terminated, died)", labels=["outcome"],
        )
        for outcome, n in sorted(snap.ended.items()):
            ended.add_metric([outcome], n)
        yield ended
        failures = CounterMetricFamily("dbexecutor_job_failures", "Attempts this worker ran that failed (raised, timed out, died)")
        failures.add_metric([], snap.failures)
        yield failures
        latency = HistogramMetricFamily(
            "dbexecutor_claim_latency_seconds", "Time of this worker's transactions that claim jobs, from request to commit"
        )
        buckets = [(repr(bound), n) for bound, n in zip(CLAIM_BUCKETS, snap.claim_buckets)] + [("+Inf", snap.claims)]
        latency.add_metric([], buckets, snap.claim_seconds)
        yield latency
        rescues = CounterMetricFamily("dbexecutor_lease_rescues", "Jobs whose lease had expired that this worker put back to ready")
        rescues.add_metric([], snap.rescued)
        yield rescues


def registry(store: Store, stats: SchedulerStats | None = None) -> CollectorRegistry:
    """A registry with the database's gauges and, given a scheduler's ``stats``, its counters."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_DatabaseCollector(store))
    if stats is not None:
        reg.register(_StatsCollector(stats))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    """The metrics in the text exposition format."""
    from prometheus_client import generate_latest

    return bytes(generate_latest(reg))


def serve(host: str, port: int, store: Store, stats: SchedulerStats | None = None) -> str:
    """Serve ``/metrics`` at ``host:port`` from a daemon thread; returns ``host:port``."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=registry(store, stats))
    return f"{host}:{port}"
