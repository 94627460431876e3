"""The ``dbexecutor`` command line: inspect, repair and serve a job database.

::

    dbexecutor status  [URL] [--watch]          counts per state and group, running jobs
    dbexecutor list    [URL] [--state S] ...    jobs matching filters
    dbexecutor show    [URL] ID                 one job: call, edges, attempts, traceback
    dbexecutor retry   [URL] ID... | --failed   failed/cancelled jobs (and their dependents) back to ready
    dbexecutor cancel  [URL] ID...              jobs that have not started (and their dependents)
    dbexecutor purge   [URL] --older-than 7d    delete finished jobs
    dbexecutor migrate [URL]                    create or upgrade the tables
    dbexecutor worker  [URL] --max-workers N    run jobs until SIGTERM/SIGINT

The URL comes from the positional argument, ``--url`` or ``$DBEXECUTOR_URL``;
the signing secret from ``$DBEXECUTOR_SECRET`` or ``--secret-file`` (never a
command-line value: other users can read a process's arguments). Nothing
here unpickles a stored blob: ``show`` reads payloads and tracebacks with
``pickletools``, which parses a pickle without running it.

Exit codes (see :data:`EXIT_CODES`): 0 ok, 1 nothing found or nothing done,
2 usage error (bad arguments or URL), 3 database unreachable or failing,
4 no dbexecutor tables here (run ``migrate``) or tables from a newer version.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
import os
import pickletools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from . import __version__, schema, serialization
from .errors import ConfigurationError, DatabaseUnavailable, PayloadRejected, SchemaVersionError
from .dialects import resolve
from .durations import parse_duration
from .store import Store, masked_url

__all__ = ["main", "parse_duration", "EXIT_CODES"]

EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_SCHEMA = 4

#: What each exit status means, for scripts.
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_NOTHING: "nothing found or nothing done (no such job, not in a state that allows it)",
    EXIT_USAGE: "usage error: bad arguments, malformed URL, unsupported database or driver",
    EXIT_DATABASE: "the database is unreachable or an SQL statement failed",
    EXIT_SCHEMA: "no dbexecutor tables with this prefix (run `dbexecutor migrate`), or tables of a newer version",
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
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _short(text: Any, width: int) -> str:
    s = "-" if text is None else " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out.write("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip() + "\n")
    for r in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = 0 if total == 0 else round(width * done / total)
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def _json(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, default=str, sort_keys=True) + "\n")


# -- reading pickles without running them -------------------------------------------


def pickle_summary(blob: bytes | None, max_items: int = 12) -> dict[str, Any]:
    """What a stored pickle refers to and holds, read with ``pickletools`` (nothing is executed).

    ``globals``: the importable names it would load (the function, classes);
    ``values``: its first literal strings and numbers; ``signed``: whether it
    carries a signature.
    """
    if blob is None:
        return {"size": 0, "signed": False, "globals": [], "values": []}
    data, signed = serialization.strip_signature(bytes(blob))
    names: list[str] = []
    values: list[Any] = []
    strings: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name == "GLOBAL" or op.name == "INST":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
                values.append(arg)
            elif isinstance(arg, (int, float, bytes)) and ("INT" in op.name or "FLOAT" in op.name or "BYTES" in op.name):
                if op.name not in ("PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"):
                    values.append(arg)
        error = None
    except Exception as exc:  # a truncated or altered pickle: say so, keep what was read
        error = f"{type(exc).__name__}: {exc}"
    # The function and argument classes are referenced by name; their own names are not arguments.
    named = {part for n in names for part in n.rsplit(".", 1)} | {n.rsplit(".", 1)[0] for n in names}
    literal = [v for v in values if not (isinstance(v, str) and v in named)]
    out: dict[str, Any] = {
        "size": len(bytes(blob)),
        "signed": signed,
        "globals": list(dict.fromkeys(names))[:max_items],
        "values": [_short(v, 60) if isinstance(v, str) else v for v in literal[:max_items]],
    }
    if error:
        out["unreadable"] = error
    return out


def stored_traceback(blob: bytes | None) -> str | None:
    """The child's formatted traceback inside a stored exception, found without unpickling it."""
    if not blob:
        return None
    data, _ = serialization.strip_signature(bytes(blob))
    best: str | None = None
    try:
        for _op, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str) and "Traceback (most recent call last)" in arg:
                if best is None or len(arg) > len(best):
                    best = arg
    except Exception:
        pass
    return best.strip().strip('"').strip() if best else None


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
    data = store.status(store.now()).as_dict()
    data["database"] = masked_url(store.url)
    data["prefix"] = store.prefix
    data["group_settings"] = {g.name: {"weight": g.weight, "limit": g.limit} for g in store.groups()}
    return data


def _print_status(data: dict[str, Any], out: TextIO) -> None:
    out.write(f"database  {data['database']}  prefix {data['prefix']!r}\n")
    states = data["states"]
    out.write(f"jobs      {data['total']} total: " + "  ".join(f"{s} {states[s]}" for s in schema.ALL_STATES) + "\n\n")
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
            ["ID", "STATE", "GROUP", "FUNCTION", "WORKER", "ATTEMPT", "AGE"],
            [[r["id"], r["state"], r["group"], _short(r["function"], 50), _holder(r), r["attempt"], _age(r["age"])] for r in data["running"]],
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


def cmd_list(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    now = store.now()
    found = store.list_jobs(
        states=args.state or (),
        queue=args.queue,
        group=args.group,
        function=args.function,
        key=args.key,
        created_before=None if args.older_than is None else now - args.older_than,
        created_after=None if args.newer_than is None else now - args.newer_than,
        limit=args.limit,
    )
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


def cmd_show(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    (job_id,) = _ids(args, exactly_one=True)
    detail = store.job_detail(job_id)
    if detail is None:
        raise _Failure(EXIT_NOTHING, f"no job with id {job_id}")
    job = dict(detail.job)
    payload, result = job.pop("payload"), job.pop("result")
    info = {
        **{k: v for k, v in job.items()},
        "arguments": pickle_summary(payload),
        "payload_signature": _signature(store, payload, serialization.PAYLOAD_CONTEXT),
        "result_size": None if result is None else len(bytes(result)),
        "result_signature": _signature(store, result, serialization.blob_context(job_id, job["state"])),
        "traceback": stored_traceback(result) if job["state"] == schema.FAILED else None,
        "depends_on": [asdict(e) for e in detail.depends_on],
        "dependents": [asdict(e) for e in detail.dependents],
        "attempts": [asdict(a) for a in detail.attempts],
    }
    if args.json:
        _json(info, out)
        return EXIT_OK
    w = out.write
    w(f"job {job_id}: {job['state']}\n")
    w(f"  function   {job['fn_name']}\n")
    args_info = info["arguments"]
    w(f"  payload    {args_info['size']} bytes, signature: {info['payload_signature']}\n")
    w(f"  refers to  {', '.join(args_info['globals']) or '-'}\n")
    w(f"  values     {', '.join(repr(v) for v in args_info['values']) or '-'}\n")
    for label, col in (
        ("key", "job_key"), ("queue", "queue"), ("group", "group_key"), ("priority", "priority"), ("timeout", "timeout"),
    ):
        w(f"  {label:<10} {job[col] if job[col] is not None else '-'}\n")
    w(f"  attempt    {job['attempt']} (retries allowed up to attempt {job['retries'] + 1})\n")
    w(f"  created    {_when(job['created_at'])}   started {_when(job['started_at'])}   finished {_when(job['finished_at'])}\n")
    if job["lease_owner"]:
        w(f"  lease      {job['lease_owner']} until {_when(job['lease_expires'])}\n")
    if result is not None:
        w(f"  result     {info['result_size']} bytes, signature: {info['result_signature']}\n")
    w(f"  error      {job['error'] or '-'}\n")
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
        if ids:
            raise UsageError("give job ids or --failed, not both")
        ids = store.ids_in_state(schema.FAILED)
    elif not ids:
        raise UsageError("retry needs job ids or --failed")
    if not ids:
        if args.json:
            _json({"revived": {}, "refused": {}}, out)
        else:
            out.write("no failed jobs\n")
        return EXIT_NOTHING
    revived, refused = store.retry(ids, args.retries, store.now())
    if args.json:
        _json({"revived": revived, "refused": refused}, out)
    else:
        for jid, state in sorted(revived.items()):
            note = "" if jid in ids else " (dependent)"
            out.write(f"job {jid}: {state}{note}\n")
        for jid, why in sorted(refused.items()):
            out.write(f"job {jid}: not retried: {why}\n")
    return EXIT_OK if revived else EXIT_NOTHING


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    ids = _ids(args)
    if not ids:
        raise UsageError("cancel needs job ids")
    finals = store.cancel(ids, store.now())
    cancelled = sorted(f.job_id for f in finals)
    missed = {}
    for jid in ids:
        if jid not in cancelled:
            row = store.job(jid)
            missed[jid] = "no such job" if row is None else f"it is {row.state}; only waiting or ready jobs can be cancelled"
    if args.json:
        _json({"cancelled": cancelled, "not_cancelled": missed}, out)
    else:
        for jid in cancelled:
            out.write(f"job {jid}: cancelled{'' if jid in ids else ' (dependent)'}\n")
        for jid, why in sorted(missed.items()):
            out.write(f"job {jid}: not cancelled: {why}\n")
    return EXIT_OK if any(i in cancelled for i in ids) else EXIT_NOTHING


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


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "off", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a limit is >= 0 (0 pauses the group), or 'none'")
    return value


def cmd_group(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    changes: dict[str, Any] = {}
    if args.weight is not None:
        if args.weight < 1:
            raise UsageError("a weight is an integer >= 1")
        changes["weight"] = args.weight
    if args.limit is not _NO_LIMIT_GIVEN:
        changes["limit"] = args.limit
    if changes:
        info = store.configure_group(args.name, **changes)
    else:
        found = [g for g in store.groups() if g.name == args.name]
        if not found:
            raise _Failure(EXIT_NOTHING, f"no group named {args.name!r}")
        info = found[0]
    if args.json:
        _json({"name": info.name, "weight": info.weight, "limit": info.limit, "vtime": info.vtime}, out)
    else:
        limit = "none" if info.limit is None else str(info.limit)
        out.write(f"group {info.name}: weight {info.weight}, limit {limit}{' (paused)' if info.limit == 0 else ''}\n")
    return EXIT_OK


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
    p.add_argument("--state", action="append", choices=schema.ALL_STATES, help="repeatable")
    p.add_argument("--queue")
    p.add_argument("--group")
    p.add_argument("--function", help="substring of the function's qualified name")
    p.add_argument("--key")
    p.add_argument("--older-than", type=parse_duration, help="created longer ago than this (7d, 12h, ...)")
    p.add_argument("--newer-than", type=parse_duration, help="created within this (30m, ...)")
    p.add_argument("--limit", type=int, default=100)

    p = sub.add_parser("show", help="one job: call, dependencies, attempts, traceback")
    _common(p, ids="the job id (optionally preceded by the URL)")

    p = sub.add_parser("retry", help="failed or cancelled jobs (and dependents that failed because of them) back to ready")
    _common(p, ids="job ids (optionally preceded by the URL)")
    p.add_argument("--failed", action="store_true", help="every failed job")
    p.add_argument("--retries", type=int, default=0, help="further retries after the next attempt (default 0)")

    p = sub.add_parser("cancel", help="cancel jobs that have not started, and their dependents")
    _common(p, ids="job ids (optionally preceded by the URL)")

    p = sub.add_parser("group", help="show or change a group's weight and concurrency limit (for every executor)")
    _common(p)
    p.add_argument("--name", required=True, help="the group")
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

    p = sub.add_parser("worker", help="run jobs from the database until SIGTERM/SIGINT")
    _common(p)
    from .worker import add_arguments

    add_arguments(p)
    return parser


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
}


def _password(url: str | None) -> str | None:
    try:
        return make_url(url).password if url else None  # type: ignore[return-value]
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
    """Console-script entry point: run :func:`main` and exit with its status."""
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
