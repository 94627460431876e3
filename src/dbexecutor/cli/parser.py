"""The arguments: the parser of every command (:func:`build_parser`), and where the URL, prefix, job ids and secret come from."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from .. import __version__, schema, serialization
from ..durations import parse_duration
from .exits import EXIT_CODES, UsageError

#: Where the database URL comes from when neither the positional argument nor ``--url`` gives it.
URL_ENV = "DBEXECUTOR_URL"


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
    from ..ui import add_arguments as add_ui_arguments

    add_ui_arguments(p)

    p = sub.add_parser("worker", help="run jobs from the database until SIGTERM/SIGINT")
    _common(p)
    from ..worker import add_arguments

    add_arguments(p)
    return parser


def _filters(p: argparse.ArgumentParser, states: Sequence[str], note: str = "") -> None:
    p.add_argument("--state", action="append", choices=states, help="repeatable" + (f"; {note}" if note else ""))
    p.add_argument("--queue", help="jobs of this queue")
    p.add_argument("--group", help="jobs of this group")
    p.add_argument("--function", help="a substring of the function's qualified name")


def _limit(text: str) -> int | None:
    if text.lower() in ("none", "off", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("a limit is >= 0 (0 pauses the group), or 'none'")
    return value


# --limit's default: None is a value it takes ('none' lifts the limit), so leaving it out needs another.
_NO_LIMIT_GIVEN: Any = object()


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
