"""A scheduler's tick in one transaction: insert new jobs, record how attempts ended, claim work.

::

    unsure reports (an earlier try may have recorded them): leave those out
    new jobs:   runnable at once, one group, free slots, nothing to record:
                    one job:  one INSERT that checks and leases
                    a burst:  one cheap read, then INSERT leased if nothing else is runnable
                else  a plain INSERT
    reports:    successes only, where the database pipelines: finish, count-down
                and the lone group's lease in one round trip
                else  finish (done / retried / failed, dependents)
    claim:      what went in leased, or what the pipeline leased, or a claim,
                unless nothing can be runnable (``look=False`` and nothing changed)
    late:       the claimed jobs handed to children before the COMMIT that ended
                while it waited: recorded, and what they released leased, again
                and again while they keep ending in time (``record_late``)

The facade (``Store.finish_and_claim``) opens the transaction, checks for a
lost ``COMMIT`` answer (``landed.tick``) and keeps the scheduler's hints
(``ctx.backlog``, ``Store.drained``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from sqlalchemy import Connection

from .. import schema
from ..dialects.base import leased_from
from ..records import Claimed, Final, Finished, NewJob, Report, Submitted
from . import claim, finish, submit
from .context import Context
from .sql import Scope

__all__ = ["BeforeCommit", "Tick", "may_lease_new", "record_late", "tick"]


#: What a transaction calls before its ``COMMIT`` with the jobs it claimed: ``(jobs, done, again)`` -> the
#: reports of those that already ended (see :func:`record_late`).
BeforeCommit = Callable[[list[Claimed], Finished, bool], Sequence[Report]]


class Tick(NamedTuple):
    """What a tick's transaction did."""

    #: The rows inserted for the new jobs, in their order.
    inserted: list[Submitted]
    #: How the reports ended (finals, released dependents, retries, refusals).
    done: Finished
    #: What it leased: new rows that went in leased, or claimed ones; then those the late reports made runnable.
    claimed: list[Claimed]
    #: The groups it wrote (for ``submit.groups_done`` once committed).
    groups: dict[str, int | None]
    #: Whether its look for work left nothing runnable; None: nothing looked, nothing made runnable.
    drained: bool | None
    #: Reports of jobs it leased that ended before its ``COMMIT`` and were recorded with it (see :func:`record_late`).
    late: list[Report]


def may_lease_new(reports: Sequence[Report], new: Sequence[NewJob], limit: int, now: float, scope: Scope) -> bool:
    """Whether ``new`` may go in leased: runnable at once, all of one group, free slots and nothing to record."""
    return (
        limit > 0
        and bool(new)
        and not reports
        and len({job.group for job in new}) == 1
        and all(submit.claimable_on_arrival(job, now, scope) for job in new)
    )


def tick(
    ctx: Context,
    conn: Connection,
    reports: Sequence[Report],
    owner: str,
    limit: int,
    ttl: float,
    now: float,
    new: Sequence[NewJob],
    scope: Scope,
    *,
    lease_new: bool,
    look: bool,
    unsure: bool,
    before_commit: BeforeCommit | None,
) -> Tick:
    """The tick's statements (see the module and ``Store.finish_and_claim`` for the arguments).

    ``lease_new``: :func:`may_lease_new`, decided once for every try of the transaction.
    """
    todo: list[Report] = list(reports)
    before: list[Final] = []  # the finals of reports an earlier tick recorded
    if reports and unsure:
        todo, before = finish.recorded_before(ctx, conn, reports)
    inserted: list[Submitted] = []
    drained: bool | None = None  # None: nothing looked, nothing made runnable
    groups: dict[str, int | None] = {}
    if new:
        groups = submit.ensure_groups(ctx, conn, new)
        if lease_new and len(new) == 1:
            inserted = [submit.insert_leased(ctx, conn, new[0], owner, ttl, now, scope)]
        elif lease_new and not ctx.backlog and submit.nothing_runnable(ctx, conn, new[0].group, now, scope, ids_for=len(new)):
            inserted = submit.insert_many(ctx, conn, new, now, lease=(owner, ttl, limit))
        else:
            inserted = submit.insert_many(ctx, conn, new, now)
    ahead: list[Claimed] | None = None  # leased in the finish's pipeline ([]: tried, none)
    if not new and finish.pipelinable(ctx, todo):
        # A tick of successes only, where the database pipelines: the
        # finish, the count-down and the lone group's lease in one
        # round trip (a chain's link: the next link leased with it).
        # The lease goes ahead only with the count-down (see finish_pipelined).
        lease = claim.lease_ahead(ctx, owner, limit, ttl, now, scope) if ctx.dependents_likely else None
        done, leased = finish.finish_pipelined(ctx, conn, todo, now, lease)
        ahead = leased_from(leased) if leased is not None else None
    else:
        done = finish.finish(ctx, conn, todo, now) if todo else Finished()
    if len(todo) < len(reports):
        done.finals = before + done.finals
        # What the committed try released is not known: as if it released something (look, notify).
        done.released += len(reports) - len(todo)
    # Rows that went in leased were the claim's only choice (nothing
    # else was runnable): then there is nothing more to claim.
    claimed = submit.leased_on_insert(new, inserted)
    made_runnable = bool(done.released or done.retried or done.refused)
    if claimed:
        # In leased: nothing else was runnable; the whole burst leased leaves nothing.
        drained = len(claimed) == len(new)
    elif ahead:
        claimed, drained = ahead, len(ahead) < limit
    elif limit > 0 and (look or new or made_runnable):
        likely = made_runnable or ctx.backlog or any(s.state == schema.READY for s in inserted)
        # The lone group's lease, sent ahead, leased nothing: the claim need not try it again.
        likely = likely and ahead is None
        claimed, drained = claim.claim(ctx, conn, owner, limit, ttl, now, scope, likely=likely)
    elif new or made_runnable:
        drained = False  # not looked, and there may be runnable rows now
    more, late = record_late(ctx, conn, owner, ttl, scope, claimed, done, before_commit)
    claimed += more
    if late and (done.released or done.retried or done.refused):
        drained = False  # perhaps the late reports made work runnable, after the last look
    # New rows this transaction claimed itself are nobody else's news.
    submit.notify_changes(ctx, conn, new, inserted, now, done, taken={c.job_id for c in claimed})
    return Tick(inserted, done, claimed, groups, drained, late)


def record_late(
    ctx: Context,
    conn: Connection,
    owner: str,
    ttl: float,
    scope: Scope,
    claimed: list[Claimed],
    done: Finished,
    before_commit: BeforeCommit | None,
) -> tuple[list[Claimed], list[Report]]:
    """Hand ``claimed`` to ``before_commit``, after the transaction's last statement; record in it the reports it returns.

    ``before_commit(jobs, done, again)`` starts jobs before the ``COMMIT``
    that leases them, and may wait a moment for them: a job that ends in
    less time than a transaction takes is then recorded by the transaction
    that leased it, one ``COMMIT`` (and one transaction) fewer. The
    dependents their finish released are leased in the same transaction
    and handed to ``before_commit`` again (``again=True``), and so on, for
    as long as it returns reports: a chain of short jobs goes through
    several links per ``COMMIT``. What the reports changed is added to
    ``done``. Returns the jobs leased here and the reports recorded, to be
    found again if the ``COMMIT`` does not answer (:func:`landed.tick`).
    """
    if before_commit is None or not claimed:
        return [], []
    more: list[Claimed] = []
    late: list[Report] = []
    batch = claimed
    again = False
    while batch:
        ended = list(before_commit(batch, done, again))
        if not ended:
            break
        late += ended
        batch = _finish_late(ctx, conn, owner, ttl, scope, ended, done)
        more += batch
        again = True
    return more, late


def _finish_late(
    ctx: Context, conn: Connection, owner: str, ttl: float, scope: Scope, reports: list[Report], done: Finished
) -> list[Claimed]:
    """Record ``reports`` (jobs this transaction leased, ended before its ``COMMIT``) into ``done``; lease what they made runnable.

    Only as many jobs as ended: their children are free again. Leased as
    a tick leases after its finish (see :func:`tick`).
    """
    now = ctx.clock.now()  # the jobs ended after the transaction's ``now``
    limit = len(reports)
    ahead: list[Claimed] | None = None
    if finish.pipelinable(ctx, reports):
        lease = claim.lease_ahead(ctx, owner, limit, ttl, now, scope) if ctx.dependents_likely else None
        part, leased = finish.finish_pipelined(ctx, conn, reports, now, lease)
        ahead = leased_from(leased) if leased is not None else None
    else:
        part = finish.finish(ctx, conn, reports, now)
    done.add(part)
    if ahead:
        return ahead
    if not (part.released or part.retried or part.refused):
        return []
    got, _ = claim.claim(ctx, conn, owner, limit, ttl, now, scope, likely=ahead is None)
    return got
