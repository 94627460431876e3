"""Creating the tables, and upgrading tables an earlier version wrote, one schema version at a time.

Opening a store creates missing tables and upgrades older ones under a
database-wide lock (an advisory lock, ``GET_LOCK`` or ``BEGIN IMMEDIATE``),
so several processes starting at once do it once. A step adds columns that
are NULL for the rows already there, and the code reads NULL as "not
recorded" (see ``arg_refs``), or replaces an index with one the previous
version's statements read as well (versions 7 to 9), so executors of the
previous version that are still running keep working against upgraded tables.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Double,
    Index,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.schema import DropConstraint

from .. import schema
from ..errors import SchemaVersionError
from .context import Context

__all__ = ["SchemaReport", "ensure_schema", "create_missing_indexes", "OLDEST_UPGRADABLE"]

log = logging.getLogger("dbexecutor.store")

#: Tables older than this came from a pre-release and cannot be upgraded in place.
OLDEST_UPGRADABLE = 2


@dataclass
class SchemaReport:
    """What opening the tables did: created them, upgraded them from ``upgraded_from``, or nothing."""

    created: bool = False
    upgraded_from: int | None = None
    created_indexes: list[str] = field(default_factory=list)


def _add_columns(ctx: Context, conn: Connection, table: Table, names: tuple[str, ...]) -> None:
    """Add the columns ``names`` of ``table`` that are not there yet.

    Checked first: on MySQL each DDL statement commits at once, so an upgrade
    interrupted halfway leaves some columns added and the version unchanged.
    """
    have = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in names:
        if name not in have:
            ctx.driver.add_column(conn, table, table.c[name])


def _v3(ctx: Context, conn: Connection) -> None:
    """Version 3: ``jobs.retry_delay``, ``jobs.arg_refs`` and ``jobs.failed_upstream``."""
    j = ctx.tables.jobs
    _add_columns(ctx, conn, j, ("retry_delay", "arg_refs", "failed_upstream"))
    # The failure cause used to live only in the error text; it is read from
    # there once, here, and kept structured from now on.
    cause = re.compile(r"^(?:DependencyFailed: upstream|batch child) job (\d+) failed")
    rows = conn.execute(select(j.c.id, j.c.error).where(j.c.state == schema.FAILED, j.c.error.is_not(None)))
    found = [{"p_id": int(r.id), "p_up": int(m.group(1))} for r in rows if (m := cause.match(r.error)) is not None]
    if found:
        conn.execute(update(j).where(j.c.id == bindparam("p_id")).values(failed_upstream=bindparam("p_up")), found)


def _v4(ctx: Context, conn: Connection) -> None:
    """Version 4: the ``executors`` table (the registry of executors and workers)."""
    ctx.tables.executors.create(conn, checkfirst=True)


def _v5(ctx: Context, conn: Connection) -> None:
    """Version 5: queues. ``jobs.queue`` (every row there is in ``default``), ``executors.queues``, and the ready index led by the queue."""
    j, e = ctx.tables.jobs, ctx.tables.executors
    _add_columns(ctx, conn, j, ("queue",))
    _add_columns(ctx, conn, e, ("queues",))
    have = {ix["name"] for ix in inspect(conn).get_indexes(j.name)}
    old = f"{ctx.prefix}ix_jobs_ready"
    if old in have:
        # A stand-in on a throwaway table object (the real one must not gain the old
        # index): SQLAlchemy spells DROP INDEX for each database.
        stand_in = Table(j.name, MetaData(), Column("group_key", String(255)))
        Index(old, stand_in.c.group_key).drop(conn)
    # Version 5's index, led by the queue, is version 8's business: it replaces it.


#: The columns and indexes version 6 added to ``jobs``.
V6_COLUMNS = ("progress", "progress_message", "progress_at", "terminate_requested")
V6_INDEXES = ("ix_jobs_state", "ix_jobs_group", "ix_jobs_function", "ix_jobs_created")


def _v6(ctx: Context, conn: Connection) -> None:
    """Version 6: a job's progress and a request to terminate it; the indexes operators' lists page through."""
    j = ctx.tables.jobs
    _add_columns(ctx, conn, j, V6_COLUMNS)
    wanted = {f"{ctx.prefix}{name}" for name in V6_INDEXES}
    have = {ix["name"] for ix in inspect(conn).get_indexes(j.name)}
    for index in sorted(j.indexes, key=lambda ix: str(ix.name)):
        if index.name in wanted and index.name not in have:
            index.create(conn)


def _v7(ctx: Context, conn: Connection) -> None:
    """Version 7: the state index holds only ``schema.LISTED_STATES``, where indexes can be partial.

    Executors of version 6 still running read the same rows through other
    plans. (MySQL/MariaDB: no partial indexes; nothing changes.)
    """
    if not ctx.driver.supports_partial_indexes:
        return
    j = ctx.tables.jobs
    name = f"{ctx.prefix}ix_jobs_state"
    found = [ix for ix in inspect(conn).get_indexes(j.name) if ix["name"] == name]
    if found and _is_partial(found[0]):
        return  # partial already (created by this version's step 6)
    if found:
        stand_in = Table(j.name, MetaData(), Column("state", String(32)))
        Index(name, stand_in.c.state).drop(conn)
    for index in j.indexes:
        if index.name == name:
            index.create(conn)


def _v8(ctx: Context, conn: Connection) -> None:
    """Version 8: the ready index in the claim's order, (group, priority, age, queue), instead of led by the queue.

    Executors of version 7 still running claim through the new index too
    (their statements name no index, except MySQL's, which do not name this one).
    """
    j = ctx.tables.jobs
    have = {ix["name"] for ix in inspect(conn).get_indexes(j.name)}
    old = f"{ctx.prefix}ix_jobs_ready_q"
    for index in j.indexes:
        if index.name == f"{ctx.prefix}ix_jobs_ready_g" and index.name not in have:
            index.create(conn)  # first: claims meanwhile never go without a ready index
    if old in have:
        stand_in = Table(j.name, MetaData(), Column("queue", String(255)))
        Index(old, stand_in.c.queue).drop(conn)


def _v9(ctx: Context, conn: Connection) -> None:
    """Version 9: where indexes can be partial, the retention index holds finished rows only and the key's unique index keyed rows only.

    Each is rebuilt in this transaction (PostgreSQL's DDL is transactional: a
    keyed submit of another executor waits for the commit rather than finding
    no unique index). SQLite cannot drop a table's constraint: there the key
    stays unique through the constraint the table was created with, which
    does what the index would, at version 8's cost.
    """
    if not ctx.driver.supports_partial_indexes:
        return
    j = ctx.tables.jobs
    insp = inspect(conn)
    found = {ix["name"]: ix for ix in insp.get_indexes(j.name)}
    constraints = {uc["name"] for uc in insp.get_unique_constraints(j.name)}
    finished, key = f"{ctx.prefix}ix_jobs_finished", f"{ctx.prefix}uq_jobs_key"
    rebuilt: set[str] = set()
    if finished in found and not _is_partial(found[finished]):
        stand_in = Table(j.name, MetaData(), Column("finished_at", Double))
        Index(finished, stand_in.c.finished_at).drop(conn)
        rebuilt.add(finished)
    if key in constraints and ctx.driver.drops_constraints:
        unique = UniqueConstraint("job_key", name=key)
        Table(j.name, MetaData(), Column("job_key", String(255)), unique)
        conn.execute(DropConstraint(unique))
        rebuilt.add(key)
    have = (found.keys() | constraints) - rebuilt
    for index in j.indexes:
        if index.name in (finished, key) and index.name not in have:
            index.create(conn)


def _v10(ctx: Context, conn: Connection) -> None:
    """Version 10: the ``functions`` table, which :func:`ensure_schema` has just created with any other missing one.

    Nothing in the other tables changes: rows written before hold their
    functions' pickles in their payloads and still run. The version is what
    changes: an executor of version 9 would not know a payload that names a
    stored function, so it refuses these tables (as for every step).
    """
    assert inspect(conn).has_table(ctx.tables.functions.name)


def _is_partial(reflected: Any) -> bool:
    """Whether a reflected index has a ``WHERE`` (the dialect names the option ``<dialect>_where``)."""
    return any(k.endswith("_where") and v is not None for k, v in reflected.get("dialect_options", {}).items())


#: version -> the step that brings the tables of the version before it up to it.
STEPS: dict[int, Callable[[Context, Connection], None]] = {
    3: _v3, 4: _v4, 5: _v5, 6: _v6, 7: _v7, 8: _v8, 9: _v9, 10: _v10,
}


def ensure_schema(ctx: Context, conn: Connection) -> SchemaReport:
    """Create the tables if missing, upgrade older ones, refuse newer ones (in the caller's transaction)."""
    report = SchemaReport()
    meta = ctx.tables.meta
    with ctx.driver.schema_lock(conn, f"dbexecutor:{ctx.prefix}"):
        report.created = not inspect(conn).has_table(ctx.tables.jobs.name)
        ctx.tables.metadata.create_all(conn, checkfirst=True)
        found = conn.execute(ctx.sql.schema_version).scalar()
        if found is None:
            conn.execute(insert(meta), [
                {"name": "schema_version", "value": str(schema.SCHEMA_VERSION)},
                {"name": "vtime", "value": "0"},
            ])
            conn.execute(insert(ctx.tables.groups).values(name=schema.DEFAULT_GROUP))
            return report
        version = int(found)
        if version > schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the tables with prefix {ctx.prefix!r} have schema version {version}, but this "
                f"dbexecutor knows only up to {schema.SCHEMA_VERSION}; upgrade dbexecutor"
            )
        if version < OLDEST_UPGRADABLE:
            raise SchemaVersionError(
                f"the tables with prefix {ctx.prefix!r} have schema version {version}, from a pre-release "
                "dbexecutor that cannot be upgraded in place; finish or drop those jobs, or use another prefix"
            )
        if version < schema.SCHEMA_VERSION:
            report.upgraded_from = version
        for step in range(version + 1, schema.SCHEMA_VERSION + 1):
            STEPS[step](ctx, conn)
            conn.execute(ctx.sql.set_schema_version, {"p_value": str(step)})
            log.warning("upgraded the tables with prefix %r to schema version %d", ctx.prefix, step)
    return report


def create_missing_indexes(ctx: Context, conn: Connection) -> list[str]:
    """Create the indexes a later release added to existing tables; their names.

    A unique constraint of an index's name stands for it (SQLite's tables
    keep the key's constraint they were created with: see version 9).
    """
    created: list[str] = []
    insp = inspect(conn)
    for table in ctx.tables.metadata.sorted_tables:
        have = {ix["name"] for ix in insp.get_indexes(table.name)}
        have |= {uc["name"] for uc in insp.get_unique_constraints(table.name)}
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            if index.name not in have:
                index.create(conn)
                created.append(str(index.name))
    return created
