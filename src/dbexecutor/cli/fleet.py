"""The installation: its tables (``migrate``), who serves it (``workers``), and whether it is healthy (``health``)."""

from __future__ import annotations

import argparse
from typing import TextIO

from .. import schema
from ..store import Store, masked_url
from .exits import EXIT_NOTHING, EXIT_OK, EXIT_SCHEMA, EXIT_UNHEALTHY, _Failure
from .format import _age, _json, _table


def cmd_migrate(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``migrate``: create the tables, or upgrade them to this version's schema."""
    report = store.migrate()
    created = report.created_indexes
    if args.json:
        _json(
            {
                "schema_version": schema.SCHEMA_VERSION,
                "created_tables": report.created,
                "upgraded_from": report.upgraded_from,
                "created_indexes": created,
            },
            out,
        )
        return EXIT_OK
    where = f"at {masked_url(store.url)} prefix {store.prefix!r}"
    if report.created:
        out.write(f"created the tables {where} (schema version {schema.SCHEMA_VERSION})\n")
    elif report.upgraded_from is not None:
        out.write(f"upgraded the tables {where} from schema version {report.upgraded_from} to {schema.SCHEMA_VERSION}\n")
    else:
        out.write(f"schema version {schema.SCHEMA_VERSION} {where}: up to date\n")
    if created and not report.created:
        out.write(f"created indexes: {', '.join(created)}\n")
    return EXIT_OK


def cmd_workers(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``workers``: the registered executors and workers (with ``--all``, also stopped or dead ones that hold nothing)."""
    found = [e for e in store.executors() if args.all or e.alive or e.running]
    if args.json:
        _json([e.as_dict() for e in found], out)
    else:
        _table(
            ["NAME", "KIND", "HOST", "PID", "AGE", "SLOTS", "RUNNING", "LAST BEAT", "STATUS"],
            [
                [e.name, e.kind, e.host, e.pid, _age(e.age), e.slots, e.running, _age(e.since_beat) + " ago",
                 "alive" if e.alive else ("stopped" if e.stopped_at is not None else "dead")
                 + ("" if e.rescue_in is None else f", jobs back to ready in {_age(e.rescue_in)}")]
                for e in found
            ],
            out,
        )
    return EXIT_OK if found else EXIT_NOTHING


def cmd_health(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``health``: exit 0 if the schema is current and a live worker serves ready work; 4 or 5 with the reason if not."""
    report = store.console.health()
    data = {"database": masked_url(store.url), "prefix": store.prefix, "reachable": True, **report.as_dict()}
    if not report.schema_current:
        status, why = EXIT_SCHEMA, (
            f"the tables are at schema version {report.schema_version}, this dbexecutor writes {report.expected_version}: "
            + ("run `dbexecutor migrate`" if (report.schema_version or 0) < report.expected_version else "upgrade dbexecutor")
        )
    elif report.starved:
        status, why = EXIT_UNHEALTHY, f"work is ready in group(s) {', '.join(report.starved)} but no live worker runs jobs"
    else:
        status, why = EXIT_OK, (
            f"ok: schema version {report.schema_version}, {report.workers_alive} live worker(s), "
            f"{len(report.runnable_groups)} group(s) with ready work"
        )
    data["ok"], data["message"] = status == EXIT_OK, why
    if args.json:
        _json(data, out)
    elif status == EXIT_OK:
        out.write(why + "\n")
    if status != EXIT_OK:
        raise _Failure(status, why)
    return EXIT_OK
