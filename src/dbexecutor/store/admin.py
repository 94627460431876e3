"""What operators read and change: status, lists and pages of jobs, one job in full, throughput, graphs, groups, retention.

Read models are the typed records of :mod:`dbexecutor.readmodels`; nothing here
unpickles a stored blob.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from ..readmodels import (
    AttemptRecord,
    Edge,
    GraphNode,
    GroupInfo,
    JobDetail,
    JobFilter,
    JobGraph,
    JobPage,
    JobProgress,
    JobSummary,
    OldestReady,
    RunningJob,
    StateCounts,
    StatusReport,
    Throughput,
)
from ..records import parse_refs
from .. import schema
from . import fleet
from .context import Context, chunks
from .sql import THROUGHPUT_BUCKETS

__all__ = [
    "status", "list_jobs", "job_page", "matching_ids", "recent_functions", "job_detail", "throughput", "graph",
    "groups", "configure_group", "purge_batch", "runnable_unpaused", "schema_version", "KEEP",
]

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
                r.progress,
                r.progress_message,
                r.terminate_requested,
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


def _like(text: str, *, contains: bool) -> str:
    """A LIKE pattern (escaped with ``/``) for ``text`` anywhere (``contains``) or at the start."""
    escaped = text.replace("/", "//").replace("%", "/%").replace("_", "/_")
    return ("%" if contains else "") + escaped + "%"


def _filter_params(f: JobFilter) -> tuple[dict[str, bool], dict[str, Any]]:
    """The statement flags and the ``p_*`` parameters of a filter."""
    one = len(f.states) == 1  # an equality, which an index on (state, id) pages through
    given: dict[str, Any] = {
        "states": None if one else list(f.states) or None, "state": f.states[0] if one else None,
        "queue": f.queue, "group": f.group, "key": f.key,
        "created_before": f.created_before, "created_after": f.created_after,
    }
    given = {name: value for name, value in given.items() if value is not None}
    params = {f"p_{name}": value for name, value in given.items()}
    flags = {name: True for name in given}
    if f.states and set(f.states) <= set(schema.LISTED_STATES):
        flags["listed"] = True
    if f.function is not None:
        flags["exact_function" if f.exact_function else "function"] = True
        params["p_function"] = f.function if f.exact_function else _like(f.function, contains=True)
    return flags, params


def _summary(r: Any) -> JobSummary:
    return JobSummary(
        int(r.id), r.state, r.queue, r.group_key, r.fn_name, r.job_key, int(r.attempt), int(r.retries),
        r.created_at, r.finished_at, r.lease_owner, r.error, r.progress, r.progress_message,
    )


def list_jobs(ctx: Context, conn: Connection, f: JobFilter, limit: int = 100) -> list[JobSummary]:
    """Jobs matching ``f``, newest first."""
    return job_page(ctx, conn, f, limit=limit).jobs


def job_page(
    ctx: Context, conn: Connection, f: JobFilter, *, before: int | None = None, after: int | None = None, limit: int = 50
) -> JobPage:
    """One page of the jobs matching ``f``, newest first: the newest ones, or those just older than
    id ``before``, or just newer than id ``after`` (keyset paging: every page costs the same)."""
    flags, params = _filter_params(f)
    if before is not None:
        flags["before"], params["p_before"] = True, before
    if after is not None and before is None:
        flags["after"], params["p_after"] = True, after
    # One row more than shown tells whether a page follows, without a count.
    params["p_limit"] = limit + 1
    rows = [_summary(r) for r in conn.execute(ctx.sql.list_jobs(**flags), params)]
    more = len(rows) > limit
    rows = rows[:limit]
    if flags.get("after"):
        rows.reverse()  # read oldest first from ``after`` up; shown newest first
        older = rows[-1].id if rows else after
        return JobPage(rows, older=older, newer=rows[0].id if rows and more else None)
    return JobPage(rows, older=rows[-1].id if rows and more else None, newer=rows[0].id if before is not None and rows else None)


def matching_ids(ctx: Context, conn: Connection, f: JobFilter, after: int | None, limit: int) -> list[int]:
    """Ids of up to ``limit`` jobs matching ``f`` with ids above ``after``, oldest first (bulk operations walk them)."""
    flags, params = _filter_params(f)
    if after is not None:
        flags["after"], params["p_after"] = True, after
    params["p_limit"] = limit
    return [int(i) for i in conn.execute(ctx.sql.matching_ids(**flags), params).scalars()]


def recent_functions(ctx: Context, conn: Connection, scan: int = 5000) -> list[str]:
    """The function names among the newest ``scan`` jobs, sorted (what a filter offers to pick from)."""
    return [str(n) for n in conn.execute(ctx.sql.recent_functions, {"p_limit": scan}).scalars()]


def job_detail(ctx: Context, conn: Connection, job_id: int) -> JobDetail | None:
    """Everything about one job: its row (pickles included), its edges both ways, and its attempts."""
    r = conn.execute(ctx.sql.job_row, {"p_id": job_id}).first()
    if r is None:
        return None
    return JobDetail(
        id=int(r.id), state=r.state, function=r.fn_name, queue=r.queue, group=r.group_key, key=r.job_key, priority=int(r.priority),
        timeout=r.timeout, retries=int(r.retries), retry_delay=r.retry_delay, attempt=int(r.attempt),
        batch=bool(r.batch), open_deps=int(r.open_deps), run_after=r.run_after, created_at=r.created_at,
        started_at=r.started_at, finished_at=r.finished_at, worker=r.lease_owner, lease_expires=r.lease_expires,
        submitted_by=r.submitted_by, error=r.error, arg_refs=parse_refs(r.arg_refs),
        failed_upstream=None if r.failed_upstream is None else int(r.failed_upstream),
        progress=JobProgress.of(r.progress, r.progress_message, r.progress_at),
        terminate_requested=r.terminate_requested,
        payload=bytes(r.payload), result=None if r.result is None else bytes(r.result),
        depends_on=[Edge(int(e.id), e.state) for e in conn.execute(ctx.sql.job_upstream, {"p_id": job_id})],
        dependents=[Edge(int(e.id), e.state) for e in conn.execute(ctx.sql.job_downstream, {"p_id": job_id})],
        attempts=[
            AttemptRecord(a.attempt, a.worker, a.started_at, a.ended_at, a.outcome, a.detail)
            for a in conn.execute(ctx.sql.job_attempts, {"p_id": job_id})
        ],
    )


def throughput(ctx: Context, conn: Connection, now: float, bucket: float = 60.0) -> Throughput:
    """Jobs finished per ``bucket`` seconds over the last ``THROUGHPUT_BUCKETS`` buckets, ending at ``now``."""
    since = now - THROUGHPUT_BUCKETS * bucket
    series = {s: [0] * THROUGHPUT_BUCKETS for s in schema.FINAL_STATES}
    params = {"p_since": since, "p_until": now, "p_width": bucket}
    for r in conn.execute(ctx.sql.throughput, params):
        i = int(r.bucket)
        if 0 <= i < THROUGHPUT_BUCKETS and r.state in series:
            series[r.state][i] += int(r.n)
    return Throughput(since, bucket, series[schema.DONE], series[schema.FAILED], series[schema.CANCELLED])


def graph(
    ctx: Context, conn: Connection, *, job_id: int | None = None, key_prefix: str | None = None, limit: int = 300
) -> JobGraph:
    """The jobs connected to job ``job_id`` (or to the jobs whose key starts with ``key_prefix``), up to ``limit``.

    Walks the dependency edges both ways, breadth first, from the seeds; a
    batch's children are its upstream jobs, so a batch brings its children.
    """
    if job_id is not None:
        seeds = [job_id]
    elif key_prefix is not None:
        seeds = [int(i) for i in conn.execute(ctx.sql.ids_by_key_prefix, {"p_prefix": _like(key_prefix, contains=False), "p_limit": limit}).scalars()]
    else:
        raise ValueError("a graph starts from a job id or a key prefix")
    seen: set[int] = set(seeds[:limit])
    edges: set[tuple[int, int]] = set()
    frontier = sorted(seen)
    truncated = len(seeds) > limit
    while frontier:
        found: set[tuple[int, int]] = set()
        for part in chunks(frontier):
            found |= {(int(up), int(dep)) for dep, up, _ in conn.execute(ctx.sql.edges_out, {"p_ids": list(part)})}
            found |= {(int(up), int(dep)) for dep, up in conn.execute(ctx.sql.edges_in, {"p_ids": list(part)})}
        nxt: list[int] = []
        for up, dep in sorted(found):
            for node in (up, dep):
                if node not in seen:
                    if len(seen) >= limit:
                        truncated = True
                        continue
                    seen.add(node)
                    nxt.append(node)
            if up in seen and dep in seen:
                edges.add((up, dep))
        frontier = nxt
    nodes: list[GraphNode] = []
    for part in chunks(sorted(seen)):
        nodes += [
            GraphNode(int(r.id), r.state, r.fn_name, r.job_key, r.group_key, bool(r.batch), r.progress)
            for r in conn.execute(ctx.sql.graph_nodes, {"p_ids": list(part)})
        ]
    return JobGraph(sorted(nodes, key=lambda n: n.id), sorted(edges), truncated)


def runnable_unpaused(ctx: Context, conn: Connection, now: float) -> list[str]:
    """The groups with work that could start at ``now`` and are not paused (limit 0)."""
    every_queue = (True, False)  # the runnable groups' key for a scope of every queue, no function skipped
    return [str(r.name) for r in conn.execute(ctx.sql.runnable_groups(every_queue), {"p_now": now}) if r.max_running != 0]


def schema_version(ctx: Context, conn: Connection) -> int | None:
    """The schema version the tables record (None: none recorded)."""
    found = conn.execute(ctx.sql.schema_version).scalar()
    return None if found is None else int(found)


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
