"""What every operation of one store shares: tables, driver, statements, signer, and the notifications it sends."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import Connection

from .. import schema, serialization
from ..dialects import Driver
from .clock import Clock
from .sql import Scope, Statements

__all__ = ["Context", "NOTIFY_IDS", "PEERS_FOR", "IN_CHUNK", "chunks"]

T = TypeVar("T")

IN_CHUNK = 500  # ids per statement: the lists stay small for every driver and every plan
NOTIFY_IDS = 600  # finished ids listed in one notification (PostgreSQL caps a payload at 8000 bytes)
PEERS_FOR = 2.0  # seconds a look at whether other executors are alive is trusted (as the doorbell's list of peers)


def chunks(ids: Sequence[T], size: int = IN_CHUNK) -> list[Sequence[T]]:
    """``ids`` in runs of at most ``size``."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]


@dataclass
class Context:
    """The state an operation needs besides its connection."""

    tables: schema.Tables
    driver: Driver
    sql: Statements
    signer: serialization.Signer
    prefix: str
    #: The database server's time (every comparison of times written by different processes uses it).
    clock: Clock
    #: Where this store's notifications go (PostgreSQL); one channel per table prefix.
    channel: str = ""
    #: Names this store's notifications, so a listener can skip its own.
    sender: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    #: Groups this process has made sure exist, with the weight it last set (None: as configured).
    groups_seen: dict[str, int | None] = field(default_factory=dict)
    #: The last claim filled every slot it had: more work is probably runnable (a hint only).
    backlog: bool = False
    #: (scope, group): the last claim of that scope that found work found it in that one group, with no limit (a hint only).
    lone_group: tuple[Scope, str] | None = None
    #: The last jobs this store finished had dependents (a chain, a DAG): count down by the statement that
    #: reads the edges, rather than read them first (a hint only: either way is right; each is the cheaper one
    #: for its case).
    dependents_likely: bool = False
    #: Notifications of the transaction running in this thread, where the database has no NOTIFY:
    #: the store hands them to :attr:`after_commit` once the transaction has committed.
    _unsent: threading.local = field(default_factory=threading.local)
    #: The executor this store registered (:meth:`Store.register`); None: a tool (the CLI, the UI), which always notifies.
    owner: str | None = None
    #: (monotonic time until which it holds, whether another executor is alive to hear a NOTIFY).
    _heard: tuple[float, bool] = (-math.inf, True)

    def __post_init__(self) -> None:
        self.channel = self.channel or f"{self.prefix}dbexecutor"

    def payload(self, *, ready: bool = False, finished: Sequence[int] = ()) -> str | None:
        """The notification saying that work became ready or jobs finished (None: nothing to say).

        ``sender  flags  ids`` (tab-separated); ``*`` instead of ids when
        there are too many to list.
        """
        if not (ready or finished):
            return None
        flags = ("r" if ready else "") + ("f" if finished else "")
        ids = "*" if len(finished) > NOTIFY_IDS else ",".join(map(str, finished))
        return f"{self.sender}\t{flags}\t{ids}"

    def notify(
        self, conn: Connection, *, ready: bool = False, finished: Sequence[int] = (), carried: str | None = None
    ) -> None:
        """Tell other processes that work became ready or jobs finished (delivered at commit; PostgreSQL only).

        Called at most once per transaction, at its end, so a burst of changes
        costs one notification. ``carried``: the notification a statement of
        this transaction sent already (see :func:`dbexecutor.store.submit.arrival_notice`);
        nothing more is sent when it says the same.
        """
        payload = self.payload(ready=ready, finished=finished)
        if payload is None or payload == carried:
            return
        if self.driver.supports_notify:
            if self.heard(conn):
                self.driver.notify(conn, self.channel, payload)
        else:
            # No NOTIFY here: sent by datagram (see dbexecutor.doorbell) once the transaction commits.
            self.unsent().append(payload)

    def heard(self, conn: Connection) -> bool:
        """Whether a NOTIFY sent now may reach another executor (read at most every :data:`PEERS_FOR` seconds).

        An executor alone on its tables (the common case) then sends none: on
        PostgreSQL each costs a statement and work at commit, per tick. A new
        executor says hello as it registers (:meth:`hello`), and whoever hears
        it reads again at its next notification (:meth:`forget_peers`); the
        re-read bounds what is missed otherwise, and polling stays the backstop.
        """
        if self.owner is None:
            return True
        until, others = self._heard
        now = time.monotonic()
        if now < until:
            return others
        found = conn.execute(self.sql.another_alive, {"p_now": self.clock.now(), "p_name": self.owner}).first()
        others = found is not None
        self._heard = (now + PEERS_FOR, others)
        return others

    def forget_peers(self) -> None:
        """Read whether another executor is alive again at the next notification (one said hello, or anything may have happened)."""
        self._heard = (-math.inf, True)

    def hello(self, conn: Connection) -> None:
        """An executor registers: tell the others, delivered at commit (PostgreSQL), so that they notify it from now on."""
        if self.driver.supports_notify:
            self.driver.notify(conn, self.channel, f"{self.sender}\th\t")

    def unsent(self) -> list[str]:
        """This thread's notifications waiting for their transaction to commit."""
        pending: list[str] | None = getattr(self._unsent, "payloads", None)
        if pending is None:
            pending = self._unsent.payloads = []
        return pending
