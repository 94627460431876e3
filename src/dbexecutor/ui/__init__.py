"""``dbexecutor ui``: a web UI on a job database (the ``ui`` extra: Starlette, uvicorn, prometheus_client).

::

    browser ──GET──► pages (HTML rendered here, no JS needed to read them)
       │  └─ every 2 s: fetch the same URL, swap the [data-live] parts
       └─POST (session cookie + CSRF token)──► actions: retry, cancel, terminate, pause, resume
    Prometheus ──GET /metrics──► the database's gauges
    scripts ──GET /api/...──► the same read models as JSON (the CLI's --json field names)

Read-only unless started with a token (``--token``, ``--token-file`` or
``$DBEXECUTOR_UI_TOKEN``): then an operator who logs in with it may act.
It listens on 127.0.0.1 unless told otherwise, and no page shows a
password, the token or the signing secret. This module only parses the
command line: the web framework loads when the UI starts.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["add_arguments", "run_ui", "TOKEN_ENV"]

#: The environment variable that holds the token which allows actions.
TOKEN_ENV = "DBEXECUTOR_UI_TOKEN"

_EXIT_USAGE = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``ui`` command's own options."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    p.add_argument("--token", default=None,
                   help=f"allow actions to whoever logs in with this token (visible to other users in the process "
                        f"list: prefer ${TOKEN_ENV} or --token-file); without one the UI is read-only")
    p.add_argument("--token-file", default=None, help="a file holding the token")
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between live updates of a page (default 2)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="the web server's log level (default WARNING)")


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            with open(args.token_file) as f:
                return f.read().strip() or None
        except OSError as error:
            raise ValueError(f"cannot read the token file: {error.strerror}") from None
    return args.token or os.environ.get(TOKEN_ENV) or None


def run_ui(args: argparse.Namespace) -> int:
    """Serve the UI until interrupted; 2 if the ``ui`` extra is missing or an option is wrong."""
    try:
        import uvicorn

        from .app import create_app
    except ImportError as error:
        sys.stderr.write(f"dbexecutor ui: the web UI needs the ui extra ({error.name} is missing): pip install 'dbexecutor[ui]'\n")
        return _EXIT_USAGE
    from ..store import Store, masked_url

    try:
        token = _token(args)
    except ValueError as error:
        sys.stderr.write(f"dbexecutor ui: {error}\n")
        return _EXIT_USAGE
    if token is not None and len(token) < 12:
        sys.stderr.write("dbexecutor ui: a token needs at least 12 characters (it is the only thing between a browser and the actions)\n")
        return _EXIT_USAGE
    store = Store(args.url, args.prefix, create=False, signer=args.signer)
    if not store.schema_present():
        store.close()
        sys.stderr.write(f"dbexecutor ui: no dbexecutor tables with prefix {args.prefix!r} at {masked_url(store.url)}; run `dbexecutor migrate`\n")
        return 4
    if token is not None and args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.stderr.write("dbexecutor ui: listening beyond this machine over plain HTTP: the token and the session "
                         "cookie cross the network in clear; put the UI behind HTTPS (a reverse proxy)\n")
    app = create_app(store, token=token, refresh=args.refresh, host=args.host)
    mode = "actions allowed after login with the token" if token else "read-only (no token)"
    sys.stderr.write(f"dbexecutor ui: http://{args.host}:{args.port}/ on {masked_url(store.url)} prefix {args.prefix!r}, {mode}\n")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=args.log_level == "DEBUG")
    finally:
        store.close()
    return 0
