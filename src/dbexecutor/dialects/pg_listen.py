"""PostgreSQL's LISTEN thread: a connection of its own, outside the pool, that hands each notification to a callback."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["listen_loop"]

log = logging.getLogger("dbexecutor.listen")


def listen_loop(
    cargs: Any,
    cparams: dict[str, Any],
    channel: str,
    callback: Callable[[str | None], None],
    stop: threading.Event,
    where: str = "",
    listen_url: bool = False,
) -> None:
    """LISTEN on ``channel`` until ``stop`` is set: ``callback(payload)`` per notification, ``callback(None)`` after each (re)connect.

    ``cargs``/``cparams``: psycopg's connect arguments (SQLAlchemy's, for
    the engine's URL or ``listen_url``); ``where``: host and port, for
    messages; ``listen_url``: the URL was given for listening (a pooler
    there is the user's choice, in session pooling). A lost connection is
    opened again with a backoff; behind a transaction pooler it returns at
    once (the process polls instead).
    """
    import psycopg
    from psycopg import sql

    backoff = 0.1
    warned = False
    while not stop.is_set():
        try:
            with psycopg.connect(*cargs, **cparams, autocommit=True) as pg:
                # A pooler (PgBouncer, ...) answers the connection with a
                # process id of its own, not the server's. In transaction
                # pooling, LISTEN there would stay on a server connection that
                # later serves other clients (PgBouncer drops what arrives on
                # it meanwhile), and nothing would reach this one: poll instead.
                # A listen_url is taken as given (a session-mode pool works).
                server_pid = pg.execute("SELECT pg_backend_pid()").fetchone()
                pooled = server_pid is not None and server_pid[0] != pg.info.backend_pid
                if pooled and not listen_url:
                    log.warning(
                        "%s goes through a connection pooler: no LISTEN there (in transaction pooling it would "
                        "lose the notifications), so this process polls for work and results from other "
                        "processes every poll_interval; give listen_url (dbexecutor worker --listen-url) "
                        "a direct URL of the server for wake-ups", where,
                    )
                    return
                if pooled and not warned:
                    warned = True
                    log.warning(
                        "listen_url %s goes through a connection pooler: LISTEN works there only in "
                        "session pooling; polling every poll_interval stays as the backstop", where,
                    )
                pg.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                callback(None)  # anything sent while we were not listening is unknown
                backoff = 0.1
                while not stop.is_set():
                    # A bounded wait, so that ``stop`` is seen within half a second.
                    for note in pg.notifies(timeout=0.5):
                        callback(note.payload)
        except psycopg.Error as error:
            if stop.is_set():
                break
            log.info("LISTEN connection lost (%s); reconnecting in %.1f s", type(error).__name__, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)
        except Exception:  # a bug in the callback must not end the wake-ups silently
            log.exception("the LISTEN thread failed; polling continues without it")
            return
