"""Running one command: :func:`main` parses, opens the store, dispatches and turns every error into an exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from ..errors import ConfigurationError, DatabaseUnavailable, SchemaVersionError
from ..dialects import resolve
from ..store import Store, masked_url
from .exits import EXIT_DATABASE, EXIT_OK, EXIT_SCHEMA, EXIT_USAGE, UsageError, _Failure
from .fleet import cmd_health, cmd_migrate, cmd_workers
from .groups import cmd_group
from .jobs import cmd_cancel, cmd_list, cmd_purge, cmd_retry, cmd_show
from .parser import _resolve_target, build_parser
from .status import cmd_status


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
            from ..worker import run_worker

            return run_worker(args)
        if args.command == "ui":
            from ..ui import run_ui

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
    from ..__main__ import main as entry

    entry()
