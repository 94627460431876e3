"""``dbexecutor worker``: run jobs from a database with no submitting executor.

A worker is a :class:`~dbexecutor.scheduler.Scheduler` with no executor in
front of it: it claims whatever is ready, so every machine with the same code
and URL adds capacity. Functions are unpickled by reference (``module.name``), so
they must be importable here (``--path`` or ``PYTHONPATH``).

Stopping (SIGTERM or SIGINT)::

    signal ──► stop claiming ──► running jobs finish (up to --grace seconds)
                                       │ grace over, or a second signal
                                       ▼
               kill the children's process trees, put their jobs back to
               ready (guarded by the attempt token) for other workers

Nothing is lost: a job a killed child held is released, or, if this process
itself is killed, its lease expires and another worker reclaims it. Nothing is
finalized twice: every release and finalize is guarded by the attempt token.

Logs (stderr, ``--log-level``, INFO by default): start and stop at INFO;
every failed attempt at WARNING (``dbexecutor.jobs``: id, function, attempt,
the exception in one line); a job that cannot be loaded here (not
importable, payload rejected, cannot unpickle) at ERROR; a dead child at
WARNING. ``--metrics-port`` serves Prometheus metrics (``metrics`` extra).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from multiprocessing.context import BaseContext
from types import FrameType

from . import serialization
from .dialects import resolve
from .durations import parse_duration
from .pool import default_context, default_workers, warm_up
from .queues import serving
from .scheduler import Scheduler, Settings
from .store import Store, masked_url

__all__ = ["add_arguments", "run_worker"]

log = logging.getLogger("dbexecutor.worker")

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"

# The command line's exit statuses (cli.EXIT_CODES) for what a worker refuses to start on.
_EXIT_USAGE = 2
_EXIT_NO_DATABASE = 4


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0 s, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``worker`` command's own options."""
    p.add_argument("--max-workers", type=_positive_int, default=None, help="child processes (default: the CPU count)")
    p.add_argument("--grace", type=parse_duration, default=30.0,
                   help="on SIGTERM/SIGINT, seconds running jobs get to finish before they are killed and put back (default 30)")
    p.add_argument("--lease-ttl", type=_positive_duration, default=30.0, help="seconds a lease lives without a heartbeat")
    p.add_argument("--poll-interval", type=_positive_duration, default=0.2, help="seconds between looks for ready work")
    p.add_argument("--timeout", type=_positive_duration, default=None, help="default per-attempt timeout of jobs without one")
    p.add_argument("--retention", type=_positive_duration, default=None, help="delete finished jobs older than this (e.g. 7d)")
    p.add_argument("--listen-url", default=os.environ.get("DBEXECUTOR_LISTEN_URL") or None, metavar="URL",
                   help="PostgreSQL behind a transaction pooler (PgBouncer): a direct URL of the server for the LISTEN "
                        "connection (default $DBEXECUTOR_LISTEN_URL; without it, such a worker polls)")
    p.add_argument("--queue", action="append", default=None, metavar="NAME", dest="queues",
                   help="serve this queue (repeatable; default: every queue, also written --queue '*')")
    p.add_argument("--path", action="append", default=[], metavar="DIR",
                   help="put DIR on sys.path so job functions can be imported (repeatable)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="log to stderr from this level (default INFO: start and stop, and every failed job)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="N",
                   help="serve Prometheus metrics at http://HOST:N/metrics (needs the metrics extra: "
                        "pip install 'dbexecutor[metrics]')")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0 for every interface)")


def _configure_logging(level: str) -> None:
    # Only the library's own logger: the root logger (and SQLAlchemy's) stay as they are.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    root = logging.getLogger("dbexecutor")
    root.addHandler(handler)
    root.setLevel(level)


def _refusal(args: argparse.Namespace) -> tuple[int, str] | None:
    """Why this worker must not start, with its exit status; None if it may."""
    try:
        serving(args.queues, default=None)
    except ValueError as error:
        return _EXIT_USAGE, f"--queue: {error}"
    if args.metrics_port is not None:
        from .metrics import available

        if not available():
            return _EXIT_USAGE, "--metrics-port needs prometheus_client: pip install 'dbexecutor[metrics]'"
        if not 0 < args.metrics_port < 65536:
            return _EXIT_USAGE, f"--metrics-port {args.metrics_port} is not a TCP port"
    for path in args.path:
        if not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            return _EXIT_USAGE, f"--path {path} {what}: job functions could not be imported from it"
    dialect = resolve(args.url)
    if dialect.database_missing():
        # Opening it would create an empty SQLite file and wait on it forever:
        # almost always a mistyped path, or a worker started before anything else.
        return _EXIT_NO_DATABASE, (
            f"no database at {masked_url(dialect.url)}; a worker does not create one "
            "(check the path, or run `dbexecutor migrate` first if you want a new database)"
        )
    return None


def run_worker(args: argparse.Namespace) -> int:
    """Serve jobs until SIGTERM/SIGINT; 0 after a clean stop, 1 if the scheduler broke.

    Refuses to start (2) on a ``--path`` that is not a directory, and (4) on
    an SQLite database file that does not exist.
    """
    refused = _refusal(args)
    if refused is not None:
        status, message = refused
        sys.stderr.write(f"dbexecutor worker: {message}\n")
        return status
    _configure_logging(args.log_level)
    for path in reversed(args.path):
        sys.path.insert(0, os.path.abspath(path))
    context = default_context()
    warm_up(context)  # the fork server starts while the store connects
    # Plain flags, not threading.Event: the handler runs in the main thread
    # between two bytecodes, possibly inside Event.wait() holding the
    # Event's lock, and Event.set() would then wait for that lock forever
    # (a worker ignored SIGTERM so, once in a CI run).
    signals: list[int] = []  # the signals received, in order

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)  # a second one: do not wait for the grace period

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        store = Store(  # secret None: $DBEXECUTOR_SECRET
            args.url, args.prefix, signer=serialization.Signer.from_env(args.secret), listen_url=args.listen_url
        )
        sched = Scheduler(store, _settings(args, context))
        if args.metrics_port is not None:
            from .metrics import serve

            try:
                where = serve(args.metrics_host, args.metrics_port, store, sched.stats)
            except OSError as error:
                sys.stderr.write(f"dbexecutor worker: cannot serve metrics at {args.metrics_host}:{args.metrics_port}: {error.strerror}\n")
                sched.request_shutdown()
                sched.join()
                store.close()
                return _EXIT_USAGE
            log.info("metrics at http://%s/metrics", where)
        log.info(
            "worker %s serving %s prefix %r, %s, with up to %d children%s%s",
            sched.owner, masked_url(store.url), args.prefix,
            "every queue" if sched.s.queues is None else "queue(s) " + ", ".join(sched.s.queues),
            sched.s.max_workers,
            ", payloads must be signed" if store.signer.enabled else "",
            f", listening at {masked_url(store.listen_url)}" if store.listen_url is not None else "",
        )
        while not signals:
            time.sleep(0.05)  # a signal's handler runs at once; the sleep then ends as it would have
            if not sched.is_alive():
                log.error("the scheduler stopped: %s", sched.broken or "see the log above")
                return 1
        log.info("received %s", signal.Signals(signals[0]).name)
        log.info("stopping: no new jobs; running jobs get %g s to finish", args.grace)
        sched.request_shutdown()
        deadline = time.monotonic() + args.grace
        while sched.is_alive() and time.monotonic() < deadline and len(signals) < 2:
            sched.join(min(0.1, max(0.0, deadline - time.monotonic())))
        if len(signals) > 1:
            log.info("received %s again: not waiting for the grace period", signal.Signals(signals[1]).name)
        if sched.is_alive():
            log.warning("grace period over: killing running jobs and putting them back to ready")
            sched.stop_now()
            sched.join()
        store.close()
        log.info("worker %s stopped", sched.owner)
        return 0 if sched.broken is None else 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _settings(args: argparse.Namespace, context: BaseContext) -> Settings:
    """The scheduler's settings from the command line (job options as a DBExecutor's defaults)."""
    return Settings(
        max_workers=args.max_workers or default_workers(),
        mp_context=context,
        initializer=None,
        initargs=(),
        max_tasks_per_child=None,
        lease_ttl=args.lease_ttl,
        heartbeat_interval=args.lease_ttl / 6,
        timeout=args.timeout,
        retry_delay=1.0,
        poll_interval=args.poll_interval,
        retention=args.retention,
        kind="worker",
        queues=serving(args.queues, default=None),
        start_children=True,
    )
