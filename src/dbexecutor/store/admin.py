"""What operators read and change: status, lists, one job in full, groups, retention.

Read models are the typed records of :mod:`dbexecutor.records`; nothing here
unpickles a stored blob.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from ..records import (
    AttemptRecord,
    Edge,
    GroupInfo,
    JobDetail,
    JobSummary,
    OldestReady,
    RunningJob,
    StateCounts,
    StatusReport,
)
from . import fleet
from .context import Context

__all__ = ["status", "list_jobs", "job_detail", "groups", "configure_group", "purge_batch", "KEEP"]

#: ``configure_group(limit=KEEP)``: leave the limit as it is.
KEEP: Any = object()


def status(
    ctx: Context, conn: Connection, now: float, host: str, alive_here: fleet.Liveness, running_limit: int = 50
) -> StatusReport:
    """Counts per state and per group, the running jobs (and whether their executor lives), the oldest ready job."""
    states = {s: int(n) for s, n in conn.execute(ctx.sql.count_states)}
    per_group: dict[str, dict[str, int]] = {}
    for g, st, n in conn.execute(ctx.sql.count_group_states):
        per_group.setdefault(g, {})[st] = int(n)
    per_queue: dict[str, dict[str, int]] = {}
    for q, st, n in conn.execute(ctx.sql.count_queue_states):
        per_queue.setdefault(q, {})[st] = int(n)
    owners = {e.name: e for e in fleet.listed(ctx, conn, now, host, alive_here)}
    running = []
    for r in conn.execute(ctx.sql.running_jobs, {"p_limit": running_limit}):
        owner = owners.get(r.lease_owner)
        rescue_in = None
        if owner is not None and not owner.alive:
            # Found dead on its machine: rescued at the next look; otherwise when its lease runs out.
            rescue_in = 0.0 if owner.rescue_in == 0.0 else max(0.0, (r.lease_expires or now) - now)
        running.append(
            RunningJob(
                int(r.id), r.fn_name, r.state, r.group_key, r.lease_owner, int(r.attempt),
                None if r.started_at is None else max(0.0, now - r.started_at),
                None if owner is None else owner.alive,
                rescue_in,
            )
        )
    oldest = conn.execute(ctx.sql.oldest_ready).first()
    return StatusReport(
        states=StateCounts.of(states),
        groups={g: StateCounts.of(c) for g, c in sorted(per_group.items())},
        queues={q: StateCounts.of(c) for q, c in sorted(per_queue.items())},
        running=running,
        oldest_ready=None
        if oldest is None
        else OldestReady(int(oldest.id), oldest.fn_name, oldest.group_key, max(0.0, now - oldest.created_at), oldest.run_after),
    )


def list_jobs(
    ctx: Context,
    conn: Connection,
    *,
    states: Sequence[str] = (),
    queue: str | None = None,
    group: str | None = None,
    function: str | None = None,
    key: str | None = None,
    created_before: float | None = None,
    created_after: float | None = None,
    limit: int = 100,
) -> list[JobSummary]:
    """Jobs matching every given filter, newest first (``function``: a substring of the name)."""
    filters: dict[str, Any] = {
        "states": list(states) or None, "queue": queue, "group": group, "function": function, "key": key,
        "created_before": created_before, "created_after": created_after,
    }
    given = {name: value for name, value in filters.items() if value is not None}
    stmt = ctx.sql.list_jobs(**{name: True for name in given})
    params = {f"p_{name}": value for name, value in given.items()}
    if function is not None:  # a substring, whatever characters it holds
        params["p_function"] = "%" + function.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"
    params["p_limit"] = limit
    return [
        JobSummary(
            int(r.id), r.state, r.queue, r.group_key, r.fn_name, r.job_key, int(r.attempt), int(r.retries),
            r.created_at, r.finished_at, r.lease_owner, r.error,
        )
        for r in conn.execute(stmt, params)
    ]


def job_detail(ctx: Context, conn: Connection, job_id: int) -> JobDetail | None:
    """Everything about one job: its columns (blobs included), its edges both ways, and its attempts."""
    row = conn.execute(ctx.sql.job_row, {"p_id": job_id}).first()
    if row is None:
        return None
    return JobDetail(
        job=dict(row._mapping),
        depends_on=[Edge(int(r.id), r.state) for r in conn.execute(ctx.sql.job_upstream, {"p_id": job_id})],
        dependents=[Edge(int(r.id), r.state) for r in conn.execute(ctx.sql.job_downstream, {"p_id": job_id})],
        attempts=[
            AttemptRecord(r.attempt, r.worker, r.started_at, r.ended_at, r.outcome, r.detail)
            for r in conn.execute(ctx.sql.job_attempts, {"p_id": job_id})
        ],
    )


def groups(ctx: Context, conn: Connection) -> list[GroupInfo]:
    """Every group, by name."""
    return [GroupInfo(r.name, r.weight, r.max_running, r.vtime) for r in conn.execute(ctx.sql.groups)]


def configure_group(ctx: Context, conn: Connection, name: str, weight: int | None, limit: Any) -> GroupInfo:
    """Create or change a group: its weight, and its limit (``None``: unlimited) unless ``KEEP``."""
    conn.execute(ctx.sql.ensure_group, {"p_name": name, "p_weight": weight or 1})
    if weight is not None:
        conn.execute(ctx.sql.set_group_weight, {"p_name": name, "p_weight": weight})
    if limit is not KEEP:
        conn.execute(ctx.sql.set_group_limit, {"p_name": name, "p_limit": limit})
        if limit is None or limit > 0:
            ctx.notify(conn, ready=True)  # a raised limit may let waiting work run elsewhere
    row = conn.execute(ctx.sql.group, {"p_name": name}).one()
    return GroupInfo(row.name, row.weight, row.max_running, row.vtime)


def purge_batch(ctx: Context, conn: Connection, cutoff: float, limit: int) -> int:
    """Delete up to ``limit`` finished jobs that finished before ``cutoff``, with their edges and attempts.

    A job is kept while any job depending on it is unfinished or finished at
    or after ``cutoff`` (an unfinished dependent still needs its result). Rows
    another transaction holds are skipped, not waited for. Returns how many
    jobs were deleted.
    """
    ids = [int(i) for i in conn.execute(ctx.sql.purge_candidates, {"p_cutoff": cutoff, "p_limit": limit}).scalars()]
    if not ids:
        return 0
    locked = [int(i) for i in conn.execute(ctx.sql.purge_lock, {"p_ids": ids, "p_cutoff": cutoff}).scalars()]
    if not locked:
        return 0
    # Checked again after the lock, in a new statement (a fresh snapshot at READ
    # COMMITTED): a submit that made one of these an upstream meanwhile has committed.
    blocked = {int(i) for i in conn.execute(ctx.sql.purge_blocked, {"p_ids": locked, "p_cutoff": cutoff}).scalars()}
    gone = sorted(set(locked) - blocked)
    if not gone:
        return 0
    conn.execute(ctx.sql.delete_attempts, {"p_ids": gone})
    conn.execute(ctx.sql.delete_edges, {"p_ids": gone})
    return int(conn.execute(ctx.sql.delete_jobs, {"p_ids": gone}).rowcount)
