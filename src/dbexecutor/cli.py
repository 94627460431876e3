"""The ``dbexecutor`` command line: inspect, repair and serve a job database.

::

    dbexecutor status  [URL] [--watch]          counts per state and group, running jobs, throughput, ETA
    dbexecutor list    [URL] [--state S] ...    jobs matching filters
    dbexecutor show    [URL] ID                 one job: call, edges, attempts, progress, traceback
    dbexecutor retry   [URL] ID... | filters    failed/cancelled jobs (and their dependents) back to ready
    dbexecutor cancel  [URL] ID... | filters    jobs that have not started (and their dependents);
                                                with --running, running ones too, wherever they run
    dbexecutor group   [URL] [--name G] ...     list groups, or show and change one
    dbexecutor workers [URL]                    registered executors and workers, alive or dead
    dbexecutor health  [URL]                    reachable, schema current, a live worker for ready work
    dbexecutor purge   [URL] --older-than 7d    delete finished jobs
    dbexecutor migrate [URL]                    create or upgrade the tables
    dbexecutor worker  [URL] --max-workers N    run jobs until SIGTERM/SIGINT
    dbexecutor ui      [URL]                    the web UI (the ``ui`` extra)

The URL comes from the positional argument, ``--url`` or ``$DBEXECUTOR_URL``;
the signing secret from ``$DBEXECUTOR_SECRET`` or ``--secret-file`` (never a
command-line value: other users can read a process's arguments). Nothing
here unpickles a stored blob: ``show`` reads payloads and tracebacks with
``pickletools``, which parses a pickle without running it. Every ``--json``
output uses the same field names (``id``, ``state``, ``group``,
``function``, ``key``, ``worker``...; see :mod:`dbexecutor.records`). Ages
and times are the database server's.

Exit codes (see :data:`EXIT_CODES`): 0 ok, 1 nothing found or nothing done,
2 usage error (bad arguments or URL), 3 database unreachable or failing,
4 no dbexecutor tables here (run ``migrate``) or tables of another version,
5 (``health``) work is ready but no live worker runs jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from . import __version__, schema, serialization
from .blobs import pickle_summary, short as _short, stored_traceback
from .errors import ConfigurationError, DatabaseUnavailable, PayloadRejected, SchemaVersionError
from .dialects import resolve
from .durations import format_age, parse_duration
from .records import JobFilter, StopRequest
from .store import Store, masked_url

__all__ = ["main", "parse_duration", "pickle_summary", "stored_traceback", "show_data", "EXIT_CODES"]

EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_SCHEMA = 4
EXIT_UNHEALTHY = 5

#: What each exit status means, for scripts.
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_NOTHING: "nothing found or nothing done (no such job, not in a state that allows it)",
    EXIT_USAGE: "usage error: bad arguments, malformed URL, unsupported database or driver",
    EXIT_DATABASE: "the database is unreachable or an SQL statement failed",
    EXIT_SCHEMA: "no dbexecutor tables with this prefix (run `dbexecutor migrate`), or tables of another version",
    EXIT_UNHEALTHY: "health: work is ready to run but no live worker runs jobs",
}

URL_ENV = "DBEXECUTOR_URL"


class UsageError(Exception):
    """A problem with the command line itself (exit status 2)."""


class _Failure(Exception):
    """End the command with ``status`` after printing ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- formatting -------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    return format_age(seconds)


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out.write("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip() + "\n")
    for r in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = 0 if total == 0 else round(width * done / total)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def _json(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, default=str, sort_keys=True) + "\n")


def _signature(store: Store, blob: bytes | None, context: bytes) -> str:
    if blob is None:
        return "-"
    if not store.signer.enabled:
        return "signed (not checked: no secret given)" if serialization.strip_signature(bytes(blob))[1] else "unsigned"
    try:
        store.signer.open(bytes(blob), context)
        return "valid"
    except PayloadRejected as rejected:
        return f"REJECTED: {rejected}"


# -- commands -----------------------------------------------------------------------


def _status_data(store: Store) -> dict[str, Any]:
    data = store.overview().as_dict()
    data["database"] = masked_url(store.url)
    data["prefix"] = store.prefix
    return data


def _print_status(data: dict[str, Any], out: TextIO) -> None:
    out.write(f"database  {data['database']}  prefix {data['prefix']!r}\n")
    states = data["states"]
    out.write(f"jobs      {data['total']} total: " + "  ".join(f"{s} {states[s]}" for s in schema.ALL_STATES) + "\n")
    flow = data["throughput"]
    done_15, failed_15 = sum(flow["done"]), sum(flow["failed"])
    rate = (sum(flow["done"][-5:]) + sum(flow["failed"][-5:])) / (5 * flow["bucket"])
    eta = "-" if data["eta"] is None else _age(data["eta"])
    out.write(
        f"flow      {rate:.2f} jobs/s over the last 5 min ({done_15} done, {failed_15} failed in 15 min); "
        f"{data['queued']} queued, ETA {eta}; {data['workers_alive']} live executor(s)\n\n"
    )
    if len(data.get("queues", {})) > 1 or set(data.get("queues", {})) - {schema.DEFAULT_QUEUE}:
        _table(
            ["QUEUE", "TOTAL", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED"],
            [
                [q, sum(c.values()), c["waiting"], c["ready"], c["leased"] + c["running"], c["done"], c["failed"], c["cancelled"]]
                for q, c in data["queues"].items()
            ],
            out,
        )
        out.write("\n")
    if data["groups"]:
        rows = []
        settings = data.get("group_settings", {})
        for g, c in data["groups"].items():
            total = sum(c.values())
            conf = settings.get(g, {})
            limit = conf.get("limit")
            rows.append([
                g, conf.get("weight", "-"), "-" if limit is None else limit, total, c["waiting"], c["ready"],
                c["leased"] + c["running"], c["done"], c["failed"], c["cancelled"], _bar(c["done"], total),
            ])
        _table(
            ["GROUP", "WEIGHT", "LIMIT", "TOTAL", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED",
             "PROGRESS (done/total)"],
            rows,
            out,
        )
        out.write("\n")
    if data["running"]:
        out.write("running\n")
        _table(
            ["ID", "STATE", "GROUP", "FUNCTION", "WORKER", "ATTEMPT", "AGE", "PROGRESS"],
            [
                [r["id"], r["state"] + (" (stopping)" if r["terminate_requested"] else ""), r["group"],
                 _short(r["function"], 50), _holder(r), r["attempt"], _age(r["age"]),
                 _short(" ".join(x for x in (_percent(r["progress"]) if r["progress"] is not None else "", r["progress_message"] or "") if x) or "-", 40)]
                for r in data["running"]
            ],
            out,
        )
        out.write("\n")
    oldest = data["oldest_ready"]
    if oldest:
        out.write(f"oldest ready: job {oldest['id']} ({_short(oldest['function'], 60)}, group {oldest['group']}) waiting {_age(oldest['age'])}\n")
    else:
        out.write("oldest ready: none\n")


def _holder(job: dict[str, Any]) -> str:
    """Who holds a running job, and if that executor is dead, when the job will be rescued."""
    worker = job["worker"] or "-"
    if job.get("worker_alive") is False:
        rescue = job.get("rescue_in")
        when = "at the next look" if not rescue else f"in {_age(rescue)}"
        return f"{worker} (dead; rescued {when})"
    return worker


def cmd_status(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    if not args.watch:
        data = _status_data(store)
        _json(data, out) if args.json else _print_status(data, out)
        return EXIT_OK
    shown = 0
    clear = out.isatty() and not args.json
    try:
        while args.count is None or shown < args.count:
            if shown:
                time.sleep(args.interval)
            data = _status_data(store)
            if args.json:
                _json(data, out)
            else:
                out.write("\x1b[H\x1b[2J" if clear else ("\n" if shown else ""))
                out.write(f"{time.strftime('%H:%M:%S')}  every {args.interval:g}s, Ctrl-C to stop\n")
                _print_status(data, out)
            out.flush()
            shown += 1
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _filter(store: Store, args: argparse.Namespace, default_states: Sequence[str] = ()) -> JobFilter:
    """The job filter given on the command line (ages on the database server's clock)."""
    now = store.now()
    older, newer = getattr(args, "older_than", None), getattr(args, "newer_than", None)
    return JobFilter(
        states=tuple(args.state or default_states),
        queue=args.queue,
        group=args.group,
        function=args.function,
        key=getattr(args, "key", None),
        created_before=None if older is None else now - older,
        created_after=None if newer is None else now - newer,
    )


def _filtered(args: argparse.Namespace) -> bool:
    return bool(args.state or args.queue or args.group or args.function)


def cmd_list(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    now = store.now()
    found = store.list_jobs(_filter(store, args), limit=args.limit)
    rows = [r.as_dict() for r in found]
    if args.json:
        _json(rows, out)
    else:
        _table(
            ["ID", "STATE", "QUEUE", "GROUP", "FUNCTION", "KEY", "ATTEMPT", "AGE", "WORKER", "ERROR"],
            [
                [r["id"], r["state"], _short(r["queue"], 20), _short(r["group"], 20), _short(r["function"], 50), _short(r["key"], 24),
                 r["attempt"], _age(now - r["created_at"]), r["worker"] or "-", _short(r["error"], 60)]
                for r in rows
            ],
            out,
        )
    return EXIT_OK if rows else EXIT_NOTHING


def show_data(store: Store, job_id: int) -> dict[str, Any] | None:
    """What ``show --json`` prints for one job (and the UI's job page shows); None if there is no such job."""
    detail = store.job_detail(job_id)
    if detail is None:
        return None
    return {
        **detail.as_dict(),
        "arguments": pickle_summary(detail.payload),
        "payload_signature": _signature(store, detail.payload, serialization.PAYLOAD_CONTEXT),
        "result_size": None if detail.result is None else len(detail.result),
        "result_signature": _signature(store, detail.result, serialization.blob_context(job_id, detail.state)),
        "traceback": stored_traceback(detail.result) if detail.state == schema.FAILED else None,
    }


def cmd_show(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    (job_id,) = _ids(args, exactly_one=True)
    info = show_data(store, job_id)
    if info is None:
        raise _Failure(EXIT_NOTHING, f"no job with id {job_id}")
    if args.json:
        _json(info, out)
        return EXIT_OK
    w = out.write
    w(f"job {job_id}: {info['state']}\n")
    w(f"  function   {info['function']}\n")
    args_info = info["arguments"]
    w(f"  payload    {args_info['size']} bytes, signature: {info['payload_signature']}\n")
    w(f"  refers to  {', '.join(args_info['globals']) or '-'}\n")
    w(f"  values     {', '.join(repr(v) for v in args_info['values']) or '-'}\n")
    for label in ("key", "queue", "group", "priority", "timeout"):
        w(f"  {label:<10} {info[label] if info[label] is not None else '-'}\n")
    w(f"  attempt    {info['attempt']} (retries allowed up to attempt {info['retries'] + 1})\n")
    w(f"  created    {_when(info['created_at'])}   started {_when(info['started_at'])}   finished {_when(info['finished_at'])}\n")
    if info["worker"]:
        w(f"  lease      {info['worker']} until {_when(info['lease_expires'])}\n")
    progress = info["progress"]
    if progress:
        w(f"  progress   {_percent(progress['fraction'])} {progress['message'] or ''} (at {_when(progress['at'])})\n")
    if info["terminate_requested"]:
        w(f"  stopping   asked to stop at {_when(info['terminate_requested'])}\n")
    if info["result_size"] is not None:
        w(f"  result     {info['result_size']} bytes, signature: {info['result_signature']}\n")
    w(f"  error      {info['error'] or '-'}\n")
    for label, edges in (("depends on", info["depends_on"]), ("dependents", info["dependents"])):
        w(f"  {label} " + (", ".join(f"{e['id']} ({e['state']})" for e in edges) or "-") + "\n")
    if info["attempts"]:
        w("\nattempts\n")
        _table(
            ["ATTEMPT", "OUTCOME", "WORKER", "STARTED", "ENDED", "DETAIL"],
            [[a["attempt"], a["outcome"], a["worker"] or "-", _when(a["started_at"]), _when(a["ended_at"]), _short(a["detail"], 70)]
             for a in info["attempts"]],
            out,
        )
    if info["traceback"]:
        w("\ntraceback (from the child)\n" + info["traceback"] + "\n")
    return EXIT_OK


def cmd_retry(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    ids = _ids(args)
    if args.failed:
        args.state = sorted(set(args.state or ()) | {schema.FAILED})
    if ids and _filtered(args):
        raise UsageError("give job ids or filters (--failed, --state, --group, --function), not both")
    if ids:
        revived, refused = store.retry(ids, args.retries, store.now())
    elif _filtered(args):
        revived, refused = store.retry_matching(_filter(store, args, default_states=(schema.FAILED,)), args.retries)
    else:
        raise UsageError("retry needs job ids, or filters: --failed, --state, --group, --function")
    if args.json:
        _json({"revived": revived, "refused": refused}, out)
    elif not revived and not refused:
        out.write("no job matches\n")
    else:
        for jid, state in sorted(revived.items()):
            note = "" if jid in ids or not ids else " (dependent)"
            out.write(f"job {jid}: {state}{note}\n")
        for jid, why in sorted(refused.items()):
            out.write(f"job {jid}: not retried: {why}\n")
    return EXIT_OK if revived else EXIT_NOTHING


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    ids = _ids(args)
    if ids and _filtered(args):
        raise UsageError("give job ids or filters (--state, --group, --function), not both")
    if not ids and not _filtered(args):
        raise UsageError("cancel needs job ids, or filters: --state, --group, --function")
    if args.running:
        if ids:
            request = store.request_stop(ids)
        else:
            request = store.stop_matching(_filter(store, args, default_states=schema.PENDING_STATES + schema.ACTIVE_STATES))
    else:
        if args.state and set(args.state) - set(schema.PENDING_STATES):
            raise UsageError("only waiting or ready jobs can be cancelled; add --running to stop running ones")
        if ids:
            cancelled = sorted(f.job_id for f in store.cancel(ids, store.now()))
            missed: dict[int, str] = {}
            for jid in ids:
                if jid not in cancelled:
                    row = store.job(jid)
                    missed[jid] = "no such job" if row is None else f"it is {row.state}; only waiting or ready jobs can be cancelled (--running stops running ones)"
            request = StopRequest(cancelled, [], missed)
        else:
            request = store.stop_matching(_filter(store, args, default_states=schema.PENDING_STATES), running=False)
    if args.json:
        _json(request.as_dict(), out)
    else:
        if not request.cancelled and not request.terminating and not request.refused:
            out.write("no job matches\n")
        for jid in request.cancelled:
            out.write(f"job {jid}: cancelled{' (dependent)' if ids and jid not in ids else ''}\n")
        for jid in request.terminating:
            out.write(f"job {jid}: running; its owner stops it at its next beat\n")
        for jid, why in sorted(request.refused.items()):
            out.write(f"job {jid}: not cancelled: {why}\n")
    asked = set(ids) if ids else set(request.cancelled) | set(request.terminating)
    acted = (set(request.cancelled) | set(request.terminating)) & asked
    return EXIT_OK if acted else EXIT_NOTHING


def cmd_purge(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    deleted = store.purge(store.now() - args.older_than, args.batch)
    if args.json:
        _json({"deleted": deleted}, out)
    else:
        out.write(f"deleted {deleted} finished job(s) older than {args.older_than:g} s\n")
    return EXIT_OK


def cmd_migrate(store: Store, args: argparse.Namespace, out: TextIO) -> int:
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
    report = store.health()
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


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "off", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a limit is >= 0 (0 pauses the group), or 'none'")
    return value


def _group_dict(info: Any, counts: dict[str, int] | None = None) -> dict[str, Any]:
    out = {"name": info.name, "weight": info.weight, "limit": info.limit, "vtime": info.vtime, "paused": info.limit == 0}
    if counts is not None:
        out["jobs"] = counts
    return out


def cmd_group(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changes: dict[str, Any] = {}
    if args.weight is not None:
        if args.weight < 1:
            raise UsageError("a weight is an integer >= 1")
        changes["weight"] = args.weight
    if args.limit is not _NO_LIMIT_GIVEN:
        changes["limit"] = args.limit
    if args.name is None:
        if changes:
            raise UsageError("--weight and --limit change one group: name it with --name")
        return _list_groups(store, args, out)
    if changes:
        info = store.configure_group(args.name, **changes)
    else:
        found = [g for g in store.groups() if g.name == args.name]
        if not found:
            raise _Failure(EXIT_NOTHING, f"no group named {args.name!r}")
        info = found[0]
    if args.json:
        _json({k: v for k, v in _group_dict(info).items() if k != "paused"}, out)
    else:
        limit = "none" if info.limit is None else str(info.limit)
        out.write(f"group {info.name}: weight {info.weight}, limit {limit}{' (paused)' if info.limit == 0 else ''}\n")
    return EXIT_OK


def _list_groups(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    counts = store.status(running_limit=0).groups
    groups = store.groups()
    rows = [_group_dict(g, counts[g.name].as_dict() if g.name in counts else {s: 0 for s in schema.ALL_STATES}) for g in groups]
    if args.json:
        _json(rows, out)
    else:
        _table(
            ["GROUP", "WEIGHT", "LIMIT", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED"],
            [
                [r["name"], r["weight"], "paused" if r["paused"] else ("none" if r["limit"] is None else r["limit"]),
                 r["jobs"]["waiting"], r["jobs"]["ready"], r["jobs"]["leased"] + r["jobs"]["running"],
                 r["jobs"]["done"], r["jobs"]["failed"], r["jobs"]["cancelled"]]
                for r in rows
            ],
            out,
        )
    return EXIT_OK if rows else EXIT_NOTHING


_NO_LIMIT_GIVEN: Any = object()


def _ids(args: argparse.Namespace, exactly_one: bool = False) -> list[int]:
    ids = list(args.ids)
    if exactly_one and len(ids) != 1:
        raise UsageError("give exactly one job id")
    return ids


# -- argument parsing ----------------------------------------------------------------


def _common(p: argparse.ArgumentParser, *, ids: str | None = None) -> None:
    p.add_argument("--url", help=f"database URL (default: ${URL_ENV})")
    p.add_argument("--prefix", default=None, help="table-name prefix (default: $DBEXECUTOR_PREFIX or none)")
    p.add_argument("--json", action="store_true", help="machine-readable output, one JSON document per line")
    p.add_argument("--secret-file", help="file holding the signing secret (default: $DBEXECUTOR_SECRET)")
    if ids is None:
        p.add_argument("target", nargs="?", metavar="URL", help="database URL")
    else:
        p.add_argument("target", nargs="*", metavar="[URL] ID", help=ids)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``dbexecutor`` command."""
    parser = argparse.ArgumentParser(
        prog="dbexecutor",
        description="Inspect, repair and serve a dbexecutor job database.",
        epilog="exit status: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"dbexecutor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", help="counts per state and group, running jobs, oldest ready job")
    _common(p)
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=parse_duration, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--count", type=int, default=None, help="with --watch: stop after this many refreshes")

    p = sub.add_parser("list", help="jobs matching filters, newest first")
    _common(p)
    _filters(p, schema.ALL_STATES)
    p.add_argument("--key")
    p.add_argument("--older-than", type=parse_duration, help="created longer ago than this (7d, 12h, ...)")
    p.add_argument("--newer-than", type=parse_duration, help="created within this (30m, ...)")
    p.add_argument("--limit", type=int, default=100)

    p = sub.add_parser("show", help="one job: call, dependencies, attempts, traceback")
    _common(p, ids="the job id (optionally preceded by the URL)")

    p = sub.add_parser("retry", help="failed or cancelled jobs (and dependents that failed because of them) back to ready")
    _common(p, ids="job ids (optionally preceded by the URL)")
    p.add_argument("--failed", action="store_true", help="every failed job (same as --state failed)")
    _filters(p, (schema.FAILED, schema.CANCELLED), "with --group/--function alone: failed")
    p.add_argument("--retries", type=int, default=0, help="further retries after the next attempt (default 0)")

    p = sub.add_parser("cancel", help="cancel jobs that have not started, and their dependents; --running: running ones too")
    _common(p, ids="job ids (optionally preceded by the URL)")
    _filters(p, schema.PENDING_STATES + schema.ACTIVE_STATES, "default: waiting and ready, and with --running leased and running")
    p.add_argument(
        "--running", action="store_true",
        help="also stop jobs that run: their owner kills the process tree at its next beat, and they end cancelled",
    )

    p = sub.add_parser("group", help="list the groups, or show or change one's weight and concurrency limit (everywhere)")
    _common(p)
    p.add_argument("--name", default=None, help="the group (without it: list every group)")
    p.add_argument("--weight", type=int, default=None, help="share of the slots when they are scarce (>= 1)")
    p.add_argument(
        "--limit", type=_limit, default=_NO_LIMIT_GIVEN,
        help="at most this many of its jobs leased or running at once, anywhere; 0 pauses, 'none' lifts it",
    )

    p = sub.add_parser("purge", help="delete finished jobs older than a bound")
    _common(p)
    p.add_argument("--older-than", type=parse_duration, required=True, help="e.g. 7d, 12h")
    p.add_argument("--batch", type=int, default=500, help="jobs deleted per transaction (default 500)")

    p = sub.add_parser("migrate", help="create or upgrade the tables")
    _common(p)

    p = sub.add_parser("workers", help="registered executors and workers: host, pid, age, running jobs, last beat, alive")
    _common(p)
    p.add_argument("--all", action="store_true", help="also those stopped or dead that hold nothing")

    p = sub.add_parser(
        "health", help="exit 0 if the database answers, its schema is current and a live worker serves ready work",
        epilog="exit status: 0 healthy; 3 database unreachable; 4 no tables, or another schema version; "
               "5 work is ready but no live worker runs jobs",
    )
    _common(p)

    p = sub.add_parser("ui", help="the web UI: overview, jobs, graphs, workers, metrics (pip install 'dbexecutor[ui]')")
    _common(p)
    from .ui import add_arguments as add_ui_arguments

    add_ui_arguments(p)

    p = sub.add_parser("worker", help="run jobs from the database until SIGTERM/SIGINT")
    _common(p)
    from .worker import add_arguments

    add_arguments(p)
    return parser


def _filters(p: argparse.ArgumentParser, states: Sequence[str], note: str = "") -> None:
    p.add_argument("--state", action="append", choices=states, help="repeatable" + (f"; {note}" if note else ""))
    p.add_argument("--queue", help="jobs of this queue")
    p.add_argument("--group", help="jobs of this group")
    p.add_argument("--function", help="a substring of the function's qualified name")


def _resolve_target(args: argparse.Namespace) -> None:
    """Split the positional arguments into the URL and job ids; fill URL, prefix and secret defaults."""
    positional = args.target if isinstance(args.target, list) else ([args.target] if args.target else [])
    url = args.url
    if positional and not positional[0].lstrip("-").isdigit():
        if url is not None:
            raise UsageError("give the URL once: as an argument or with --url")
        url = positional.pop(0)
    args.ids = []
    if isinstance(args.target, list):
        try:
            args.ids = [int(x) for x in positional]
        except ValueError:
            raise UsageError(f"job ids are integers, got {' '.join(positional)}") from None
    elif positional:
        raise UsageError(f"unexpected argument {positional[0]!r}")
    url = url or os.environ.get(URL_ENV)
    if not url:
        raise UsageError(f"no database URL: pass it as an argument, with --url, or in ${URL_ENV}")
    args.url = url
    if args.prefix is None:
        args.prefix = os.environ.get("DBEXECUTOR_PREFIX", "")
    secret: str | None = None
    if args.secret_file:
        try:
            with open(args.secret_file) as f:
                secret = f.read().strip()
        except OSError as error:
            raise UsageError(f"cannot read the secret file: {error.strerror}") from None
    args.secret = secret
    args.signer = serialization.Signer.from_env(secret)


_COMMANDS: dict[str, Callable[[Store, argparse.Namespace, TextIO], int]] = {
    "status": cmd_status,
    "list": cmd_list,
    "show": cmd_show,
    "retry": cmd_retry,
    "cancel": cmd_cancel,
    "purge": cmd_purge,
    "group": cmd_group,
    "migrate": cmd_migrate,
    "workers": cmd_workers,
    "health": cmd_health,
}


def _password(url: str | None) -> str | None:
    try:
        return make_url(url).password if url else None
    except ArgumentError:
        return None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)  # exits with 2 on a usage error, as argparse does
    password: str | None = None

    def fail(status: int, message: str) -> int:
        # Whatever the message quotes, the password never reaches the terminal.
        if password:
            message = message.replace(password, "***")
        sys.stderr.write(f"dbexecutor {args.command}: {message}\n")
        return status

    try:
        _resolve_target(args)
        password = _password(args.url)
        if args.command == "worker":
            from .worker import run_worker

            return run_worker(args)
        if args.command == "ui":
            from .ui import run_ui

            return run_ui(args)
        if args.command != "migrate" and resolve(args.url).database_missing():
            # Reading must not leave an empty SQLite file behind.
            return fail(EXIT_SCHEMA, f"no database at {masked_url(resolve(args.url).url)}; run `dbexecutor migrate` first")
        store = Store(args.url, args.prefix, create=False, signer=args.signer)
        try:
            if args.command != "migrate" and not store.schema_present():
                return fail(
                    EXIT_SCHEMA,
                    f"no dbexecutor tables with prefix {args.prefix!r} at {masked_url(store.url)}; "
                    "run `dbexecutor migrate` (or check --prefix)",
                )
            return _COMMANDS[args.command](store, args, out)
        finally:
            store.close()
    except UsageError as error:
        parser.print_usage(sys.stderr)
        return fail(EXIT_USAGE, str(error))
    except _Failure as error:
        return fail(error.status, str(error))
    except DatabaseUnavailable as error:
        return fail(EXIT_DATABASE, str(error))
    except SchemaVersionError as error:
        return fail(EXIT_SCHEMA, str(error))
    except (ConfigurationError, ValueError) as error:
        return fail(EXIT_USAGE, str(error))
    except DBAPIError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig is not None else type(error).__name__
        return fail(EXIT_DATABASE, f"database error: {reason}")
    except SQLAlchemyError as error:
        return fail(EXIT_DATABASE, f"database error: {type(error).__name__}: {str(error).splitlines()[0]}")
    except BrokenPipeError:
        return EXIT_OK  # `dbexecutor list | head`


def main_exit() -> None:
    """Run :func:`dbexecutor.__main__.main`: ``dbexecutor`` scripts installed by earlier builds still call this."""
    from .__main__ import main as entry

    entry()


if __name__ == "__main__":
    main_exit()
