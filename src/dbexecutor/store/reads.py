"""What executors read back: final rows, results, one job, ids by key or state."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from .. import schema
from ..records import Final
from .context import Context, chunks

__all__ = ["existing", "finals", "results", "upstream_results", "job", "job_id_for_key", "count_states", "unfinished", "ids_in_state"]


def existing(ctx: Context, conn: Connection, job_ids: Sequence[int]) -> set[int]:
    """Which of ``job_ids`` have a row (those a committed transaction wrote)."""
    out: set[int] = set()
    for part in chunks(list(job_ids)):
        out.update(int(r.id) for r in conn.execute(ctx.sql.job_states, {"p_ids": list(part)}))
    return out


def finals(ctx: Context, conn: Connection, job_ids: Sequence[int]) -> list[Final]:
    """The given jobs that are in a final state, with their result or exception."""
    out: list[Final] = []
    for part in chunks(list(job_ids)):
        out += [Final(int(r.id), r.state, r.result) for r in conn.execute(ctx.sql.finals, {"p_ids": list(part)})]
    return out


def results(ctx: Context, conn: Connection, job_ids: Sequence[int]) -> dict[int, bytes]:
    """Result pickles of the done jobs among ``job_ids``."""
    out: dict[int, bytes] = {}
    for part in chunks(list(job_ids)):
        out.update((int(r.id), r.result) for r in conn.execute(ctx.sql.results, {"p_ids": list(part)}))
    return out


def upstream_results(ctx: Context, conn: Connection, job_ids: Sequence[int]) -> dict[int, dict[int, bytes]]:
    """For each of ``job_ids``, the results of its done upstream jobs (for rows that did not record ``arg_refs``)."""
    out: dict[int, dict[int, bytes]] = {int(i): {} for i in job_ids}
    for part in chunks(list(job_ids)):
        for r in conn.execute(ctx.sql.upstream_results, {"p_ids": list(part)}):
            out[int(r.job_id)][int(r.id)] = r.result
    return out


def job(ctx: Context, conn: Connection, job_id: int) -> Final | None:
    """One job's state (with its result or exception if final), or None if there is no such job."""
    row = conn.execute(ctx.sql.job_state, {"p_id": job_id}).first()
    if row is None:
        return None
    return Final(job_id, row.state, row.result if row.state in schema.FINAL_STATES else None)


def job_id_for_key(ctx: Context, conn: Connection, key: str) -> int | None:
    """The id of the job with ``key``, or None."""
    found = conn.execute(ctx.sql.id_for_key, {"p_key": key}).scalar()
    return None if found is None else int(found)


def count_states(ctx: Context, conn: Connection) -> dict[str, int]:
    """Number of jobs per state (states with no job left out)."""
    return {state: int(n) for state, n in conn.execute(ctx.sql.count_states)}


def unfinished(ctx: Context, conn: Connection) -> list[int]:
    """Ids of every job that is not in a final state, oldest first."""
    return [int(i) for i in conn.execute(ctx.sql.unfinished_ids).scalars()]


def ids_in_state(ctx: Context, conn: Connection, state: str) -> list[int]:
    """Ids of every job in ``state``, oldest first."""
    return [int(i) for i in conn.execute(ctx.sql.ids_in_state, {"p_state": state}).scalars()]
