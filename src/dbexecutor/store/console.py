"""What operators read and do across a whole database: the front of the CLI, the web UI and the metrics.

::

    Store.console ─► Console
                      ├─ status, overview, health       admin, fleet
                      ├─ list_jobs, job_page, graph     admin (read models, nothing unpickled)
                      ├─ job_detail, recent_functions   admin
                      └─ retry_matching, stop_matching  a filter's jobs, a batch per transaction

:class:`~dbexecutor.store.Store` keeps what executors, workers and their
futures do while jobs run (submit, claim, finish, leases, the registry,
cancel and retry by id, retention); what people ask of the database lives
here, on the store's transactions. Each method opens its own transaction,
as the store's do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from .. import hosts, schema
from ..readmodels import HealthReport, JobDetail, JobFilter, JobGraph, JobPage, JobSummary, Overview, StatusReport, StopRequest
from . import admin, fleet

if TYPE_CHECKING:
    from . import Store

__all__ = ["Console"]


class Console:
    """Operators' reads and bulk actions on one store's tables (``store.console``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def status(self, now: float | None = None, running_limit: int = 50) -> StatusReport:
        """Counts per state, queue and group, the running jobs (and whether their executor lives), the oldest ready job (ages at ``now``, default the server's now)."""
        return self._store.read(
            admin.status, self._store.now() if now is None else now, hosts.hostname(), hosts.process_alive, running_limit
        )

    def overview(self, running_limit: int = 50) -> Overview:
        """Status, group settings, throughput over the last minutes, an ETA for what is queued, live executors."""
        host = hosts.hostname()

        def work(conn: Connection) -> Overview:
            now = self._store.now()
            report = admin.status(self._store.ctx, conn, now, host, hosts.process_alive, running_limit)
            rate_of = admin.throughput(self._store.ctx, conn, now)
            live = sum(1 for e in fleet.listed(self._store.ctx, conn, now, host, hosts.process_alive) if e.alive)
            c = report.states
            queued = c.waiting + c.ready + c.leased + c.running
            rate = rate_of.rate(5)  # the last five minutes: recent enough to follow a change of pace
            eta = queued / rate if queued and rate > 0 else None
            return Overview(report, admin.groups(self._store.ctx, conn), rate_of, queued, eta, live, now)

        return self._store.transaction(work, read_only=True)

    def list_jobs(self, f: JobFilter | None = None, *, limit: int = 100, **filters: Any) -> list[JobSummary]:
        """Jobs matching ``f`` (or the keyword filters, the fields of :class:`JobFilter`), newest first."""
        f = f if f is not None else JobFilter(**filters)
        return self._store.read(admin.list_jobs, f, limit)

    def job_page(
        self, f: JobFilter | None = None, *, before: int | None = None, after: int | None = None, limit: int = 50
    ) -> JobPage:
        """A page of jobs matching ``f``, newest first, older than id ``before`` or newer than id ``after``."""
        f = f if f is not None else JobFilter()
        return self._store.transaction(
            lambda conn: admin.job_page(self._store.ctx, conn, f, before=before, after=after, limit=limit), read_only=True
        )

    def explain_page(self, f: JobFilter, *, before: int | None = None, limit: int = 50) -> list[str]:
        """The database's plan for the statement of :meth:`job_page` (for tests and tuning)."""
        flags, params = admin._filter_params(f)
        if before is not None:
            flags["before"], params["p_before"] = True, before
        params["p_limit"] = limit + 1
        stmt = self._store.ctx.sql.list_jobs(**flags)
        return self._store.transaction(lambda conn: self._store.driver.explain(conn, stmt, params))

    def recent_functions(self, scan: int = 5000) -> list[str]:
        """The function names among the newest ``scan`` jobs, sorted."""
        return self._store.read(admin.recent_functions, scan)

    def graph(self, *, job_id: int | None = None, key_prefix: str | None = None, limit: int = 300) -> JobGraph:
        """The jobs connected to a job, or to the jobs whose key starts with ``key_prefix`` (see :func:`admin.graph`)."""
        return self._store.transaction(
            lambda conn: admin.graph(self._store.ctx, conn, job_id=job_id, key_prefix=key_prefix, limit=limit), read_only=True
        )

    def schema_version(self) -> int | None:
        """The schema version the tables record (None: no tables, or none recorded)."""
        if not self._store.schema_present():
            return None
        return self._store.read(admin.schema_version)

    def health(self) -> HealthReport:
        """The schema version, the groups with work that could start now (not paused), and the live workers."""
        version = self.schema_version()
        if version != schema.SCHEMA_VERSION:
            return HealthReport(version, schema.SCHEMA_VERSION, [], 0)
        host = hosts.hostname()

        def work(conn: Connection) -> HealthReport:
            now = self._store.now()
            groups = admin.runnable_unpaused(self._store.ctx, conn, now)
            alive = [e for e in fleet.listed(self._store.ctx, conn, now, host, hosts.process_alive) if e.alive and e.slots > 0]
            return HealthReport(version, schema.SCHEMA_VERSION, groups, len(alive))

        return self._store.transaction(work, read_only=True)

    def job_detail(self, job_id: int) -> JobDetail | None:
        """Everything about one job: its row (pickles included), its edges both ways, and its attempts."""
        return self._store.read(admin.job_detail, job_id)

    # -- acting on every job a filter matches -------------------------------------------------------

    def retry_matching(self, f: JobFilter, retries: int, batch: int = 500) -> tuple[dict[int, str], dict[int, str]]:
        """:meth:`Store.retry` every job matching ``f`` (only failed or cancelled ones can be), ``batch`` per transaction."""
        revived: dict[int, str] = {}
        refused: dict[int, str] = {}
        for ids in self._walk(f, batch):
            got, why = self._store.retry(ids, retries, self._store.now())
            revived.update(got)
            refused.update(why)
        return revived, {i: w for i, w in refused.items() if i not in revived}

    def stop_matching(self, f: JobFilter, *, running: bool = True, batch: int = 500) -> StopRequest:
        """:meth:`Store.request_stop` (or, not ``running``, :meth:`Store.cancel`) for every job matching ``f``, ``batch`` per transaction."""
        cancelled: set[int] = set()
        terminating: list[int] = []
        refused: dict[int, str] = {}
        for ids in self._walk(f, batch):
            if not running:
                done = {x.job_id for x in self._store.cancel(ids, self._store.now())}
                cancelled |= done
                refused.update({i: "it started meanwhile" for i in ids if i not in done})
                continue
            got = self._store.request_stop(ids)
            cancelled.update(got.cancelled)
            terminating += got.terminating
            refused.update(got.refused)
        return StopRequest(sorted(cancelled), sorted(terminating), {i: w for i, w in refused.items() if i not in cancelled})

    def _walk(self, f: JobFilter, batch: int) -> Iterator[list[int]]:
        """The ids matching ``f``, oldest first, ``batch`` at a time (each read after the previous batch was acted on)."""
        after: int | None = None
        while ids := self._store.read(admin.matching_ids, f, after, batch):
            yield ids
            after = ids[-1]
