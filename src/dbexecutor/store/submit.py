"""Writing submitted jobs: rows, dependency edges, groups, and leasing on insert.

A job's state on arrival is decided by its upstream rows, read under a lock
in the same transaction (so an upstream cannot finish between "count open
dependencies" and "insert the edges" and leave the job waiting forever):
``ready``, ``waiting``, or at once ``failed``/``cancelled`` below a failed or
cancelled upstream. A batch is never ready: with every child already done it
is rolled up on insert.

When a tick writes runnable jobs of one group to an executor with free slots
and nothing else could be claimed first, the rows go in already ``leased``
(:func:`insert_leased` for one job, ``insert_many(lease=...)`` for a burst):
the claim could only have picked them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection
from sqlalchemy.engine import Row

from .. import schema
from ..records import Claimed, Dep, Earlier, Finished, NewJob, Submitted, format_refs
from . import dag
from .context import Context, chunks
from .sql import Scope

__all__ = [
    "by_key",
    "ensure_groups",
    "groups_done",
    "insert_job",
    "insert_many",
    "insert_leased",
    "nothing_runnable",
    "one_write",
    "leased_on_insert",
    "claimable_on_arrival",
    "runnable_on_arrival",
    "notify_changes",
    "arrival_notice",
]


def runnable_on_arrival(job: NewJob, state: str, now: float) -> bool:
    """Whether a new row is runnable right away (ready, and not delayed)."""
    return state == schema.READY and (job.run_after is None or job.run_after <= now)


def by_key(ctx: Context, conn: Connection, key: str) -> Submitted | None:
    """The job with ``key`` (its result if it is finished), or None."""
    row = conn.execute(ctx.sql.job_by_key, {"p_key": key}).first()
    if row is None:
        return None
    return Submitted(int(row.id), row.state, row.result if row.state in schema.FINAL_STATES else None, True)


# -- groups -----------------------------------------------------------------------------------------


def ensure_groups(ctx: Context, conn: Connection, jobs: Sequence[NewJob]) -> dict[str, int | None]:
    """Create the groups of ``jobs`` this process has not seen, and set weights given with them.

    Returns what was done, for :func:`groups_done` once the transaction commits.
    """
    todo: dict[str, int | None] = {}
    for job in jobs:
        if not _group_written(ctx, job):
            todo[job.group] = job.weight if job.weight is not None else todo.get(job.group)
    for name, weight in todo.items():
        conn.execute(ctx.sql.ensure_group, {"p_name": name, "p_weight": weight or 1})
        if weight is not None:
            conn.execute(ctx.sql.set_group_weight, {"p_name": name, "p_weight": weight})
    return todo


def one_write(ctx: Context, jobs: Sequence[NewJob]) -> bool:
    """Whether writing ``jobs`` is one statement: one job with no upstream, key or children, in a group already written.

    Such a write needs no transaction around it (see ``Database.txn``);
    reads before it (whether another executor listens) may run outside one.
    """
    return len(jobs) == 1 and jobs[0].leasable and _group_written(ctx, jobs[0])


def _group_written(ctx: Context, job: NewJob) -> bool:
    """Whether this process wrote ``job``'s group, with the weight ``job`` sets if it sets one."""
    seen = ctx.groups_seen.get(job.group, -1)
    return seen != -1 and (job.weight is None or job.weight == seen)


def groups_done(ctx: Context, todo: dict[str, int | None]) -> None:
    """Remember groups written by a committed transaction (a rolled-back insert must try again)."""
    for name, weight in todo.items():
        ctx.groups_seen[name] = weight if weight is not None else ctx.groups_seen.get(name)


# -- rows -------------------------------------------------------------------------------------------


def ids_of(deps: Sequence[Dep]) -> tuple[int, ...]:
    """``deps`` as the ids they must be by now (the submit queue and :func:`insert_many` name the others)."""
    for d in deps:
        if type(d) is not int:
            raise TypeError(f"the store writes job ids, not {d!r}: an upstream still being written was not named")
    return tuple(deps)  # type: ignore[arg-type]


def _row(job: NewJob, state: str, now: float, open_deps: int = 0) -> dict[str, Any]:
    """The columns of ``job``'s new row (every row of a multi-row insert has the same keys)."""
    return {
        "state": state,
        "fn_name": job.fn_name,
        "payload": job.payload,
        "job_key": job.key,
        "group_key": job.group,
        "queue": job.queue,
        "batch": int(job.batch),
        "priority": job.priority,
        "timeout": job.timeout,
        "retries": job.retries,
        "retry_delay": job.retry_delay,
        "arg_refs": format_refs(ids_of(job.refs)),
        "failed_upstream": None,
        "open_deps": open_deps,
        "run_after": job.run_after,
        "submitted_by": job.submitted_by,
        "created_at": now,
        "result": None,
        "error": None,
        "finished_at": None,
    }


def lock_upstream(ctx: Context, conn: Connection, ids: Iterable[int]) -> dict[int, Row[Any]]:
    """The rows of the jobs ``ids`` depend on, locked until the transaction ends.

    Locked in id order, 500 ids per statement: however many jobs a
    transaction inserts, their upstream rows cost a round trip or a few.
    """
    found: dict[int, Row[Any]] = {}
    for part in chunks(sorted(set(ids))):
        found.update((r.id, r) for r in conn.execute(ctx.sql.lock_upstream, {"p_ids": list(part)}))
    return found


def _row_after(ctx: Context, job: NewJob, upstream: dict[int, Any], now: float) -> dict[str, Any]:
    """``job``'s new row, its state decided by its (locked) upstream rows."""
    state, result, error, finished, cause = schema.READY, None, None, None, None
    open_deps = 0
    if job.deps:
        deps = ids_of(job.deps)
        rows = [upstream[d] for d in deps if d in upstream]
        if len(rows) < len(deps):
            missing = sorted(set(deps) - upstream.keys())
            raise ValueError(f"dependency job(s) {missing} do not exist in this database")
        # The first failure (in time) decides, as when it happens later.
        for r in sorted(rows, key=lambda r: (r.state != schema.FAILED, r.finished_at or 0.0, r.id)):
            if r.state == schema.FAILED:
                state, finished, cause = schema.FAILED, now, int(r.id)
                result, error = dag.inherited_failure(ctx, int(r.id), r.result, batch=job.batch)
                break
        if state == schema.READY and any(r.state == schema.CANCELLED for r in rows):
            state, finished = schema.CANCELLED, now
        open_deps = sum(r.state != schema.DONE for r in rows)
        if state == schema.READY and open_deps:
            state = schema.WAITING
    row = _row(job, state, now, open_deps)
    row.update(result=result, error=error, finished_at=finished, failed_upstream=cause)
    return row


def _edges(jobs: Sequence[NewJob], ids: Sequence[int]) -> list[dict[str, Any]]:
    """The dependency edges of ``jobs``, inserted as ``ids`` (a batch's keep their positions)."""
    return [
        {"job_id": job_id, "depends_on_id": d, "position": i if job.batch else None}
        for job, job_id in zip(jobs, ids)
        for i, d in enumerate(job.deps)
    ]


def _insert_edges(ctx: Context, conn: Connection, jobs: Sequence[NewJob], ids: Sequence[int]) -> None:
    """Insert the dependency edges of ``jobs``, just inserted as ``ids``."""
    ctx.driver.insert_rows(conn, ctx.tables.deps, _edges(jobs, ids))


def _insert_with_deps(ctx: Context, conn: Connection, job: NewJob, now: float, upstream: dict[int, Any]) -> Submitted:
    """Insert one job (no key lookup) with its edges; ``upstream``: its upstream rows, already locked."""
    row = _row_after(ctx, job, upstream, now)
    # A batch is never ready: with every child already done it is rolled up below.
    roll_up_now = job.batch and row["state"] == schema.READY
    if roll_up_now:
        row["state"] = schema.WAITING
    (job_id,) = ctx.driver.insert_job_rows(conn, ctx.tables.jobs, [row])
    _insert_edges(ctx, conn, [job], [job_id])
    if roll_up_now:
        final = dag.roll_up(ctx, conn, [job_id], now)[0]
        return Submitted(job_id, final.state, final.result)
    return Submitted(job_id, row["state"], row["result"])


def insert_job(ctx: Context, conn: Connection, job: NewJob, now: float) -> tuple[Submitted, dict[str, int | None]]:
    """Insert one job and its edges; with a taken key, the existing job instead. Also the groups written."""
    if job.key is not None:
        found = by_key(ctx, conn, job.key)
        if found is not None:
            return found, {}
    groups = ensure_groups(ctx, conn, [job])
    out = _insert_with_deps(ctx, conn, job, now, lock_upstream(ctx, conn, ids_of(job.deps)))
    ctx.notify(
        conn,
        ready=runnable_on_arrival(job, out.state, now),
        finished=[out.job_id] if out.state in schema.FINAL_STATES else (),
    )
    return out, groups


def insert_many(
    ctx: Context,
    conn: Connection,
    jobs: Sequence[NewJob],
    now: float,
    lease: tuple[str, float, int] | None = None,
    notice: str | None = None,
) -> list[Submitted]:
    """Insert ``jobs`` (no keys) in the caller's transaction, ids in input order.

    Every upstream row (a batch's too) is locked first, in id order; then each
    run of jobs goes in as one multi-row statement, and all their edges with
    one more at the end. Only a batch (rolled up on insert) goes alone, and a
    job that depends on one in its run (:class:`Earlier`) starts a new run:
    its row records that upstream's id. ``lease``: ``(owner, ttl, limit)``:
    the ``limit`` best runnable rows (priority, then order) go in leased to
    ``owner``, as a claim would lease them; the caller has made sure that
    nothing else is runnable. ``notice``: the notification the insert
    itself sends (from :func:`arrival_notice`).
    """
    if any(job.key is not None for job in jobs):
        raise ValueError("keyed jobs go through insert_job, which looks the key up first")
    # Upstream rows by id: locked ones, and (below) rows this write inserted that later jobs depend on.
    upstream: dict[int, Any] = lock_upstream(ctx, conn, [d for job in jobs for d in job.deps if type(d) is int])
    # The positions of the jobs others here depend on: their new rows stand in for locked upstream rows.
    wanted = {d.index for job in jobs for d in job.deps if type(d) is Earlier}
    if wanted and ctx.driver.reserves_ids and not any(job.batch for job in jobs):
        return _insert_reserved(ctx, conn, jobs, now, upstream, wanted)
    ids: list[int] = []
    edges: list[dict[str, Any]] = []
    out: list[Submitted] = []
    i = 0
    while i < len(jobs):
        if jobs[i].batch:
            job = _named(jobs[i], ids)
            out.append(_insert_with_deps(ctx, conn, job, now, upstream))
            ids.append(out[-1].job_id)
            i += 1
            continue
        end = i + 1
        while end < len(jobs) and not jobs[end].batch and not _needs_earlier(jobs[end], i):
            end += 1
        run = [_named(job, ids) for job in jobs[i:end]]
        rows = [_row_after(ctx, job, upstream, now) for job in run]
        if lease is not None:
            _mark_leased(run, rows, now, *lease)
        carry = (ctx.channel, notice) if notice is not None else None
        new_ids = ctx.driver.insert_job_rows(conn, ctx.tables.jobs, rows, notify=carry)
        edges += _edges(run, new_ids)
        for n, (job_id, row) in enumerate(zip(new_ids, rows), start=i):
            out.append(Submitted(job_id, row["state"], row["result"]))
            if n in wanted:
                upstream[job_id] = _NewRow(job_id, row["state"], row["result"], row["finished_at"])
        ids += new_ids
        i = end
    ctx.driver.insert_rows(conn, ctx.tables.deps, edges)
    return out


def _insert_reserved(
    ctx: Context, conn: Connection, jobs: Sequence[NewJob], now: float, upstream: dict[int, Any], wanted: set[int]
) -> list[Submitted]:
    """Jobs that depend on each other (a chain) with ids reserved first: one statement for the rows, one for the edges."""
    ids = ctx.driver.reserve_ids(conn, ctx.tables.jobs, len(jobs))
    named: list[NewJob] = []
    rows: list[dict[str, Any]] = []
    for n, job in enumerate(jobs):
        job = _named(job, ids, n)
        row = _row_after(ctx, job, upstream, now)
        row["id"] = ids[n]
        if n in wanted:
            upstream[ids[n]] = _NewRow(ids[n], row["state"], row["result"], row["finished_at"])
        named.append(job)
        rows.append(row)
    ctx.driver.insert_rows(conn, ctx.tables.jobs, rows)
    ctx.driver.insert_rows(conn, ctx.tables.deps, _edges(named, ids))
    return [Submitted(job_id, row["state"], row["result"]) for job_id, row in zip(ids, rows)]


class _NewRow(NamedTuple):
    """A row inserted by this transaction, read as :func:`lock_upstream` reads an upstream row."""

    id: int
    state: str
    result: bytes | None
    finished_at: float | None


def _needs_earlier(job: NewJob, start: int) -> bool:
    """Whether ``job`` depends on a job of the same write at ``start`` or later (not inserted before its run)."""
    return any(type(d) is Earlier and d.index >= start for d in job.deps)


def _named(job: NewJob, ids: Sequence[int], known: int | None = None) -> NewJob:
    """``job`` with its :class:`Earlier` upstreams named by their ids (the first ``known`` of ``ids``: all by default)."""
    if not job.deps:
        return job
    known = len(ids) if known is None else known
    named: dict[Dep, Dep] = {}
    for d in job.deps:
        if type(d) is Earlier:
            if d.index >= known:
                raise ValueError(f"job {d.index} of this write is not inserted before the job that depends on it")
            named[d] = ids[d.index]
    return job.renamed(named)


def arrival_notice(ctx: Context, conn: Connection, jobs: Sequence[NewJob], now: float) -> str | None:
    """The notification a write of ``jobs`` alone will send, when the insert statement itself can send it.

    Where the driver can (``notifies_on_insert``: PostgreSQL's ``pg_notify()``
    in the ``INSERT``), one job with no upstream and no batch: its state on
    arrival is ``ready`` whatever the database holds, so the notification is
    known before the insert, and a round trip of its own is saved (about
    0.2-0.4 ms of a durable submit's 1.5 ms). None otherwise: the
    notification goes after the insert, from what it wrote. None too when
    no other executor would hear it (:meth:`Context.heard`), as for any other.
    """
    if not ctx.driver.notifies_on_insert or len(jobs) != 1 or jobs[0].deps or jobs[0].batch:
        return None
    payload = ctx.payload(ready=runnable_on_arrival(jobs[0], schema.READY, now))
    return payload if payload is not None and ctx.heard(conn) else None


def notify_changes(
    ctx: Context,
    conn: Connection,
    jobs: Sequence[NewJob],
    rows: Sequence[Submitted],
    now: float,
    done: Finished | None = None,
    taken: Iterable[int] = (),
    carried: str | None = None,
) -> None:
    """Tell other processes what a transaction of inserts (and finishes) changed, at its commit.

    Work is ready if a finish released or retried jobs, or a new row is
    runnable and not among ``taken`` (rows this transaction leased itself);
    finished: the jobs ``done`` finalized and new rows already final.
    ``carried``: what the insert sent already (:func:`arrival_notice`).
    """
    mine = set(taken)
    # A job finalized by its child may have released dependents there: said so, for whoever claims.
    ready = bool(done and (done.released or done.retried or done.refused or done.finalized)) or any(
        runnable_on_arrival(job, row.state, now) and row.job_id not in mine for job, row in zip(jobs, rows)
    )
    finished = [f.job_id for f in done.finals] if done else []
    ctx.notify(
        conn, ready=ready, finished=finished + [r.job_id for r in rows if r.state in schema.FINAL_STATES], carried=carried
    )


# -- leased on insert -------------------------------------------------------------------------------


def _mark_leased(jobs: Sequence[NewJob], rows: list[dict[str, Any]], now: float, owner: str, ttl: float, limit: int) -> None:
    """Mark the ``limit`` best runnable ``rows`` leased to ``owner`` (attempt 1), before they are inserted."""
    runnable = [i for i, (job, row) in enumerate(zip(jobs, rows)) if runnable_on_arrival(job, row["state"], now)]
    runnable.sort(key=lambda i: (-jobs[i].priority, i))
    chosen = set(runnable[:limit])
    for i, row in enumerate(rows):
        # Every row gets the same columns: the multi-row insert takes them all alike.
        mine = i in chosen
        row.update(
            state=schema.LEASED if mine else row["state"],
            attempt=1 if mine else 0,
            lease_owner=owner if mine else None,
            lease_expires=now + ttl if mine else None,
            started_at=now if mine else None,
        )


def nothing_runnable(ctx: Context, conn: Connection, group: str, now: float, scope: Scope, ids_for: int = 0) -> bool:
    """Whether new runnable jobs of ``group`` would be the claim's only choice (nothing else runnable in the scope, no limit).

    ``ids_for``: the number of rows about to be inserted, whose ids are
    drawn in the same round trip where they come from a sequence.
    """
    params = {"p_group": group, "p_now": now, **scope.params()}
    if ids_for:
        rows = ctx.driver.run_reserving(conn, ctx.sql.free_for(scope.key), params, ctx.tables.jobs, ids_for)
        return bool(rows.rows[0][0])
    return bool(conn.execute(ctx.sql.free_for(scope.key), params).scalar())


def claimable_on_arrival(job: NewJob, now: float, scope: Scope) -> bool:
    """Whether a claim in ``scope`` could lease ``job``'s row the moment it is inserted (so the insert may lease it)."""
    return (
        job.leasable
        and (job.run_after is None or job.run_after <= now)
        and scope.serves(job.queue)
        and job.fn_name not in scope.skip
    )


def insert_leased(ctx: Context, conn: Connection, job: NewJob, owner: str, ttl: float, now: float, scope: Scope) -> Submitted:
    """Insert one runnable ``job``, leased to ``owner`` if nothing else in its scope could be claimed before it (one statement)."""
    row = _row(job, schema.READY, now)
    params = {f"p_{name}": row[name] for name in ctx.sql.LEASED_INSERT_COLUMNS}
    params.update(p_group=job.group, p_now=now, p_owner=owner, p_expires=now + ttl, **scope.params())
    job_id, state = ctx.driver.insert_reading_state(conn, ctx.sql.insert_leased(scope.key), params, ctx.tables.jobs)
    return Submitted(job_id, state)


def leased_on_insert(jobs: Sequence[NewJob], rows: Sequence[Submitted]) -> list[Claimed]:
    """The claims of the rows that went in leased, in the order a claim would have taken them."""
    got = [(job, row) for job, row in zip(jobs, rows) if row.state == schema.LEASED]
    got.sort(key=lambda pair: (-pair[0].priority, pair[1].job_id))
    # Only a job with no upstream goes in leased: it takes no results (refs ()).
    return [Claimed(row.job_id, 1, job.payload, job.fn_name, job.timeout, (), job.retry_delay) for job, row in got]
