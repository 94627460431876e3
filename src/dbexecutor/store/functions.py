"""The program's functions pickled by value, stored once in the ``functions`` table and named by digest in payloads.

::

    submit ──► embed_call: a pickle used again ──► FunctionTable.reference()
                 writes the row once (renews used_at every half hour) ──► the payload names its digest
    dispatch ◄── FunctionTable.fetch(payloads): the pickles the claimed jobs name, read once per process
             ──► Supervisor sends each child those it has not had (Call.functions)
    retention ──► sweep(): the pickles no job left in the table can name

A script's job function travels by value (cloudpickle, 500-2,000 bytes); a
row of ``jobs`` is written three times in its life, so ten thousand jobs of
one function wrote its pickle thirty thousand times and sent it to the
children ten thousand times. A pickle reused by a second payload goes to
this table instead (the first stays embedded: a function that captures a
value which changes at every call would otherwise add a row per call), and
every later payload names it (a payload of ~115 bytes instead of ~560 for
a one-line function).

**Why nothing in the job's transaction writes it.** The pickle is committed
before any job that names it (the submitting thread writes it, once, before
it hands the job on); every way of writing jobs then stays as it was. A
pickle whose job never lands is swept as any other.

**Why no job can lose its pickle.** A process renews ``used_at`` before it
names a pickle whose renewal is older than :data:`RENEW_AFTER`; retention
deletes only pickles whose ``used_at`` is older than :data:`KEEP_FOR` before
the oldest job left in the table (or now, if none). A job in the table was
submitted at most :data:`RENEW_AFTER` after its pickle's last renewal, so
that ``used_at`` is at least ``created_at - RENEW_AFTER``, well inside the
margin. Times are the server's clock, as every other here. The one gap: a
submit queued in its executor for more than half an hour before its row is
written (the database unreachable that long) may find its pickle swept;
other executors then refuse the job, and its own, which holds the pickle,
runs it.

**Why a child runs only the pickle its payload named.** The digest is the
SHA-256 of the pickle, read back here and checked before the pickle is
kept: a row altered in the database does not match the name in the payload
(which a secret, if configured, signs).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ..byvalue import FunctionByValue, StoredFunction, stored_in
from .context import Context

if TYPE_CHECKING:
    from . import Store

__all__ = ["FunctionTable", "RENEW_AFTER", "KEEP_FOR", "save", "load", "sweep"]

log = logging.getLogger("dbexecutor.store")

#: A process renews a pickle's ``used_at`` before naming it once the last renewal is this old (seconds).
RENEW_AFTER = 1800.0
#: Retention keeps a pickle named this long before the oldest job left in the table (seconds).
KEEP_FOR = 2 * RENEW_AFTER


def save(ctx: Context, conn: Connection, digest: str, data: bytes, now: float) -> None:
    """Store ``data`` under ``digest``, or renew its ``used_at`` if it is there."""
    params = {"p_digest": digest, "p_now": now}
    if conn.execute(ctx.sql.touch_function, params).rowcount:
        return
    conn.execute(ctx.sql.insert_function, {**params, "p_data": data})


def load(ctx: Context, conn: Connection, digest: str) -> bytes | None:
    """The pickle stored under ``digest`` if it is there and matches it (None otherwise)."""
    data = conn.execute(ctx.sql.function_data, {"p_digest": digest}).scalar()
    if data is None:
        return None
    data = bytes(data)
    if hashlib.sha256(data).hexdigest() != digest:
        log.warning("the stored function %s... does not match its digest: not used", digest[:16])
        return None
    return data


def sweep(ctx: Context, conn: Connection, now: float) -> int:
    """Delete the pickles no job left in the table can name (see the module's docstring); how many went."""
    oldest = conn.execute(ctx.sql.oldest_job).scalar()
    bound = min(now, float(oldest) if oldest is not None else now) - KEEP_FOR
    return int(conn.execute(ctx.sql.delete_unnamed_functions, {"p_bound": bound}).rowcount)


class FunctionTable:
    """One store's side of the stored functions: what this process wrote, and the pickles it has read."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._renewed: dict[str, float] = {}  # digest -> when this process last wrote or renewed it (server clock)
        self._data: dict[str, bytes] = {}  # digest -> pickle, for the children

    def reference(self, made: FunctionByValue) -> StoredFunction | None:
        """``made`` named by its digest, the pickle written (or renewed) first; None: embed it.

        Only a pickle a payload took before goes to the table; and only if
        the write succeeds (a database that refuses it costs the payload its
        size, nothing else).
        """
        if not made.reused:
            return None
        ref = made.stored
        now = self._store.now()
        with self._lock:
            last = self._renewed.get(ref.digest)
            if last is not None and now - last < RENEW_AFTER:
                return ref
            try:
                self._store.transaction(lambda conn: save(self._store.ctx, conn, ref.digest, made.data, now))
            except IntegrityError:
                pass  # another process stored it between the renewal and the insert: it is there
            except SQLAlchemyError as error:
                log.debug("could not store a function by value (%s): embedded in the payload instead", error)
                return None
            self._renewed[ref.digest] = now
            self._data[ref.digest] = made.data
        return ref

    def fetch(self, payloads: Iterable[bytes]) -> None:
        """Read the pickles ``payloads`` name that this process does not have yet (once each)."""
        wanted = {d for p in payloads for d in stored_in(p)} - self._data.keys()
        for digest in sorted(wanted):
            try:
                data = self._store.read(load, digest)
            except SQLAlchemyError as error:
                log.warning("could not read the stored function %s...: %s", digest[:16], error)
                continue
            if data is not None:
                with self._lock:
                    self._data[digest] = data

    def cached(self, digest: str) -> bytes | None:
        """The pickle stored under ``digest``, if this process has it (no read)."""
        return self._data.get(digest)

    def has_all(self, payloads: Sequence[bytes]) -> bool:
        """Whether this process has every pickle ``payloads`` name (they can be dispatched without a read)."""
        return all(d in self._data for p in payloads for d in stored_in(p))
