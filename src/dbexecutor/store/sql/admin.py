"""Statements of operators' reads: running and oldest jobs, filtered lists, throughput, one job in full, graphs.

Lists are filtered by the flags named True and paged by id
(``list_jobs``, ``matching_ids``); ``store.admin`` and ``store.control``
run them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from sqlalchemy import Integer, Select, func, literal_column, select

from ... import schema
from .base import StatementsBase, _p

__all__ = ["AdminStatements", "THROUGHPUT_BUCKETS"]

#: Buckets of the throughput operators see (minutes, by default).
THROUGHPUT_BUCKETS = 15


class AdminStatements(StatementsBase):
    """What operators read: lists, one job in full, progress, throughput, graphs."""

    @cached_property
    def running_jobs(self) -> Select[Any]:
        """Up to ``p_limit`` leased or running jobs, longest running first, with their progress."""
        j = self.tables.jobs
        return (
            select(
                j.c.id, j.c.fn_name, j.c.state, j.c.group_key, j.c.lease_owner, j.c.attempt, j.c.started_at,
                j.c.lease_expires, j.c.progress, j.c.progress_message, j.c.terminate_requested,
            )
            .where(self.active)
            .order_by(j.c.started_at, j.c.id)
            .limit(_p("limit", type_=Integer))
        )

    @cached_property
    def oldest_ready(self) -> Select[Any]:
        """The job that has been ready longest."""
        j = self.tables.jobs
        return (
            select(j.c.id, j.c.fn_name, j.c.group_key, j.c.created_at, j.c.run_after)
            .where(self.ready)
            .order_by(j.c.created_at, j.c.id)
            .limit(1)
        )

    def _filtered(self, stmt: Select[Any], **given: bool) -> Select[Any]:
        """``stmt`` narrowed by the filters named True.

        Their parameters: ``p_states`` (a list) or ``p_state`` (with ``listed`` when every state
        is one of ``schema.LISTED_STATES``), ``p_queue``, ``p_group``, ``p_function``
        (a LIKE pattern escaped with ``/``; with ``exact_function``, a name),
        ``p_key``, ``p_created_before``/``p_created_after`` (times),
        ``p_before``/``p_after`` (ids, for keyset paging).
        """
        j = self.tables.jobs
        conditions: dict[str, Callable[[], Any]] = {
            "states": lambda: j.c.state.in_(_p("states", expanding=True)),
            "state": lambda: j.c.state == _p("state"),
            # Repeats the partial state index's predicate (the states are all among
            # them), where a database reads a partial index only when the query says so.
            "listed": lambda: schema.states_in(j.c.state, schema.LISTED_STATES),
            "queue": lambda: j.c.queue == _p("queue"),
            "group": lambda: j.c.group_key == _p("group"),
            "function": lambda: j.c.fn_name.like(_p("function"), escape="/"),
            "exact_function": lambda: j.c.fn_name == _p("function"),
            "key": lambda: j.c.job_key == _p("key"),
            "created_before": lambda: j.c.created_at < _p("created_before"),
            "created_after": lambda: j.c.created_at >= _p("created_after"),
            "before": lambda: j.c.id < _p("before", type_=Integer),
            "after": lambda: j.c.id > _p("after", type_=Integer),
        }
        unknown = set(given) - set(conditions)
        if unknown:
            raise TypeError(f"unknown filters {sorted(unknown)}")
        if not self.driver.repeats_index_predicate:
            given = {**given, "listed": False}
        return stmt.where(*(conditions[name]() for name, on in given.items() if on))

    def list_jobs(self, *, after: bool = False, **given: bool) -> Select[Any]:
        """Jobs matching the filters named True (see ``_filtered``), ``p_limit`` of them, newest first (oldest first with ``after``)."""
        j = self.tables.jobs
        stmt = select(
            j.c.id, j.c.state, j.c.queue, j.c.group_key, j.c.fn_name, j.c.job_key, j.c.attempt, j.c.retries,
            j.c.created_at, j.c.finished_at, j.c.lease_owner, j.c.error, j.c.progress, j.c.progress_message,
        )
        # Keyset paging on the primary key: a page costs the same at any depth,
        # and each filter has an index led by its column and followed by the id.
        order = j.c.id.asc() if after else j.c.id.desc()
        paged: Select[Any] = self._filtered(stmt, after=after, **given).order_by(order).limit(_p("limit", type_=Integer))
        leading = [name for name in ("state", "group", "exact_function") if given.get(name)]
        if (after or given.get("before")) and len(leading) == 1 and not any(given.get(n) for n in ("states", "function")):
            column = {"state": "state", "group": "group", "exact_function": "function"}[leading[0]]
            paged = self.driver.along_index(paged, j, self._jobs_index(column))
        return paged

    def matching_ids(self, **given: bool) -> Select[Any]:
        """Ids of up to ``p_limit`` jobs matching the filters named True (as :meth:`list_jobs`), oldest first."""
        j = self.tables.jobs
        return self._filtered(select(j.c.id), **given).order_by(j.c.id).limit(_p("limit", type_=Integer))

    @cached_property
    def recent_functions(self) -> Select[Any]:
        """The distinct function names among the ``p_limit`` newest jobs (what a filter offers to pick)."""
        j = self.tables.jobs
        newest = select(j.c.fn_name).order_by(j.c.id.desc()).limit(_p("limit", type_=Integer)).subquery("newest")
        return select(newest.c.fn_name).distinct().order_by(newest.c.fn_name)

    @cached_property
    def throughput(self) -> Select[Any]:
        """Jobs that finished in ``[p_since, p_until)``, per bucket of ``p_width`` seconds and final state."""
        j = self.tables.jobs
        since = _p("since", j.c.finished_at)
        bucket = self.driver.bucket(j.c.finished_at - since, _p("width", j.c.finished_at)).label("bucket")
        # The range on finished_at reads the retention index; grouped by position, since the
        # bucket's expression holds parameters that the server would not match by text.
        return (
            select(bucket, j.c.state, func.count().label("n"))
            .where(j.c.finished_at >= since, j.c.finished_at < _p("until", j.c.finished_at), self.final)
            .group_by(literal_column("1"), literal_column("2"))
        )

    @cached_property
    def job_progress(self) -> Select[Any]:
        """Job ``p_id``'s progress: fraction, message, when it was written."""
        j = self.tables.jobs
        return select(j.c.progress, j.c.progress_message, j.c.progress_at).where(j.c.id == _p("id"))

    @cached_property
    def graph_nodes(self) -> Select[Any]:
        """What a graph draws of jobs ``p_ids``: state, function, key, group, batch flag, progress."""
        j = self.tables.jobs
        return select(
            j.c.id, j.c.state, j.c.fn_name, j.c.job_key, j.c.group_key, j.c.batch, j.c.progress
        ).where(self._ids(j.c.id))

    @cached_property
    def edges_in(self) -> Select[Any]:
        """``(job_id, depends_on_id)`` of every edge into the jobs ``p_ids`` (what they depend on)."""
        d = self.tables.deps
        return select(d.c.job_id, d.c.depends_on_id).where(self._ids(d.c.job_id))

    @cached_property
    def ids_by_key_prefix(self) -> Select[Any]:
        """Ids of up to ``p_limit`` jobs whose key starts with ``p_prefix`` (a LIKE pattern escaped with ``/``), oldest first."""
        j = self.tables.jobs
        return select(j.c.id).where(j.c.job_key.like(_p("prefix"), escape="/")).order_by(j.c.id).limit(_p("limit", type_=Integer))

    @cached_property
    def job_row(self) -> Select[Any]:
        """Every column of job ``p_id``."""
        j = self.tables.jobs
        return select(j).where(j.c.id == _p("id"))

    @cached_property
    def job_upstream(self) -> Select[Any]:
        """The jobs job ``p_id`` depends on, with their states."""
        j, d = self.tables.jobs, self.tables.deps
        return select(j.c.id, j.c.state).join(d, d.c.depends_on_id == j.c.id).where(d.c.job_id == _p("id")).order_by(j.c.id)

    @cached_property
    def job_downstream(self) -> Select[Any]:
        """The jobs that depend on job ``p_id``, with their states."""
        j, d = self.tables.jobs, self.tables.deps
        return select(j.c.id, j.c.state).join(d, d.c.job_id == j.c.id).where(d.c.depends_on_id == _p("id")).order_by(j.c.id)

    @cached_property
    def job_attempts(self) -> Select[Any]:
        """Job ``p_id``'s attempts, in the order they were written."""
        a = self.tables.attempts
        return select(a).where(a.c.job_id == _p("id")).order_by(a.c.id)
