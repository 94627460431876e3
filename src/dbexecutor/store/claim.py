"""The claim: lease up to N runnable jobs in one transaction, fair across groups, within their limits.

::

    work expected, and the last claim found one group without a limit:
                lease its best rows if it is still the only choice (one statement);
                the rest only if that leased nothing
    read the groups with runnable work
    one group without a limit:  lease its best rows (priority, then age)
    else:       lock the rows of those groups (name order),
                count leased + running jobs of the limited ones,
                hand the free slots out by stride scheduling (fairshare.Allocation),
                lease each group's share, advance the virtual times

The group rows are locked first, so claims that could touch the same groups
take turns and the limits and virtual times they read stay true until they
commit; the job rows themselves are locked with ``SKIP LOCKED`` (or, on
SQLite, by ``BEGIN IMMEDIATE``), so claims on different groups never wait
for each other.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from .. import schema
from ..records import Claimed
from .context import Context
from .fairshare import Allocation, GroupState, capacity
from .sql import Scope

__all__ = ["claim", "explain", "lease_ahead", "runnable_groups"]


def runnable_groups(ctx: Context, conn: Connection, now: float, scope: Scope) -> list[str]:
    """Names of the groups with runnable work in ``scope`` (a read that takes no write lock)."""
    return list(conn.execute(ctx.sql.runnable_groups(scope.key), {"p_now": now, **scope.params()}).scalars())


def claim(
    ctx: Context,
    conn: Connection,
    owner: str,
    limit: int,
    ttl: float,
    now: float,
    scope: Scope,
    *,
    likely: bool = False,
) -> tuple[list[Claimed], bool]:
    """Lease up to ``limit`` runnable jobs of ``scope`` to ``owner`` for ``ttl`` seconds, in the caller's transaction.

    Also says whether the claim left nothing runnable in ``scope`` (rows that
    other claims hold locked aside): no runnable group, or one group without
    a limit that had fewer runnable rows than ``limit``. False when unsure.

    ``likely``: the caller knows of runnable work (it released or inserted
    some, or the last claim filled its slots). If the last claim of this
    scope found a single group without a limit, that group's rows are then
    leased at once, by a statement that leases nothing unless the group is
    still the only choice: one statement fewer. Only if it leases nothing
    does the whole claim follow (a read of which groups have work first).
    """
    lone = ctx.lone_group
    if likely and lone is not None and lone[0] == scope:
        got = _lease(ctx, conn, lone[1], limit, owner, ttl, max(now, ctx.clock.now()), scope, alone=True)
        if got:
            return got, len(got) < limit
    params = {"p_now": now, **scope.params()}
    rows = conn.execute(ctx.sql.runnable_groups(scope.key), params).all()
    if not rows:
        return [], True
    ctx.lone_group = (scope, rows[0].name) if len(rows) == 1 and rows[0].max_running is None else None
    if len(rows) == 1 and rows[0].max_running is None:
        # One runnable group without a limit (the common case): its best rows,
        # skipping those other claims hold. Nothing is shared to take turns on:
        # no limit to count, no virtual time moves with a single group. Locking
        # its row would make claims from many executors queue behind each other.
        got = _lease(ctx, conn, rows[0].name, limit, owner, ttl, max(now, ctx.clock.now()), scope)
        return got, len(got) < limit
    return _claim_groups(ctx, conn, owner, limit, ttl, now, scope, params), False


def _claim_groups(
    ctx: Context, conn: Connection, owner: str, limit: int, ttl: float, now: float, scope: Scope, params: dict[str, Any]
) -> list[Claimed]:
    """Several runnable groups, or one with a limit: lock their rows, count the limits, share the slots."""
    rows = conn.execute(ctx.sql.runnable_groups_locked(scope.key), params).all()
    if not rows:
        return []
    limited = [r.name for r in rows if r.max_running is not None]
    running: dict[str, int] = {}
    if limited:
        running = {name: int(n) for name, n in conn.execute(ctx.sql.running_per_group, {"p_groups": limited}).all()}
    # Taken after the locks and the counts: a job claimed here starts after
    # every job whose end these counts saw (the rows prove limits).
    now = max(now, ctx.clock.now())
    groups = [GroupState(r.name, r.weight, r.vtime, r.max_running, running.get(r.name, 0)) for r in rows]
    if len(groups) == 1:
        # One runnable group: priority, then age; no virtual time moves.
        share = capacity(groups[0], limit)
        return _lease(ctx, conn, groups[0].name, share, owner, ttl, now, scope) if share > 0 else []
    if not any(capacity(g, limit) > 0 for g in groups):
        return []
    global_vtime = float(conn.execute(ctx.sql.global_vtime_locked).scalar() or 0.0)
    alloc = Allocation(groups, limit, global_vtime)
    picked: dict[str, list[Claimed]] = {}
    while wants := alloc.next_round():
        for name, k in wants.items():
            got = _lease(ctx, conn, name, k, owner, ttl, now, scope)
            picked.setdefault(name, []).extend(got)
            alloc.record(name, k, len(got))
    updates = alloc.vtime_updates()
    if updates:
        conn.execute(ctx.sql.set_group_vtime, [{"p_name": n, "p_vtime": v} for n, v in updates.items()])
    new_global = alloc.global_vtime()
    if new_global != global_vtime:
        conn.execute(ctx.sql.set_global_vtime, {"p_value": repr(new_global)})
    return alloc.interleave(picked)


def _lease(
    ctx: Context,
    conn: Connection,
    group: str,
    limit: int,
    owner: str,
    ttl: float,
    now: float,
    scope: Scope,
    *,
    alone: bool = False,
) -> list[Claimed]:
    return ctx.driver.lease_rows(conn, ctx.sql, _lease_params(group, limit, owner, ttl, now, scope), scope.key, alone=alone)


def _lease_params(group: str, limit: int, owner: str, ttl: float, now: float, scope: Scope) -> dict[str, Any]:
    return {"p_group": group, "p_now": now, "p_owner": owner, "p_expires": now + ttl, "p_limit": limit, **scope.params()}


def lease_ahead(ctx: Context, owner: str, limit: int, ttl: float, now: float, scope: Scope) -> tuple[Any, dict[str, Any]] | None:
    """The statement :func:`claim` starts with when work is expected, to be sent ahead of the claim (``Driver.pipelined``).

    The last claim of ``scope`` found one group without a limit: its best
    rows, leased only if it is still the only choice. None if there is no
    such group, no free slot, or no ``UPDATE ... RETURNING``. Its rows:
    ``dialects.base.leased_from``; if it leased none, :func:`claim` with
    ``likely=False`` does the rest.
    """
    lone = ctx.lone_group
    if limit <= 0 or lone is None or lone[0] != scope or not ctx.driver.update_returning:
        return None
    params = _lease_params(lone[1], limit, owner, ttl, max(now, ctx.clock.now()), scope)
    return ctx.sql.lease_picked_alone(scope.key), params


def explain(ctx: Context, conn: Connection, now: float, limit: int, scope: Scope) -> dict[str, list[str]]:
    """The database's plans for the claim's statements, one line per plan row (see ``Store.explain_claim``)."""
    sql, driver = ctx.sql, ctx.driver
    params = {
        "p_group": schema.DEFAULT_GROUP, "p_now": now, "p_owner": "explain", "p_expires": now, "p_limit": limit,
        **scope.params(),
    }
    lease, lease_params = (
        (sql.lease_picked(scope.key), params)
        if driver.update_returning
        else (sql.lease_ids, {**params, "p_ids": list(range(1, limit + 1))})
    )
    alone = sql.lease_picked_alone(scope.key) if driver.update_returning else sql.pick_alone(scope.key)
    return {
        "groups": driver.explain(conn, sql.runnable_groups(scope.key), {"p_now": now, **scope.params()}),
        "claim": driver.explain(conn, sql.pick(scope.key), params),
        "lease": driver.explain(conn, lease, lease_params),
        "alone": driver.explain(conn, alone, params),
    }
