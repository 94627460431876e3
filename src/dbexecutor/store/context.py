"""What every operation of one store shares: tables, driver, statements, signer, and the notifications it sends."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import Connection

from .. import schema, serialization
from ..dialects import Driver
from .clock import Clock
from .sql import Statements

__all__ = ["Context", "NOTIFY_IDS", "IN_CHUNK", "chunks"]

T = TypeVar("T")

IN_CHUNK = 500  # ids per statement: the lists stay small for every driver and every plan
NOTIFY_IDS = 600  # finished ids listed in one notification (PostgreSQL caps a payload at 8000 bytes)


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
    #: Notifications of the transaction running in this thread, where the database has no NOTIFY:
    #: the store hands them to :attr:`after_commit` once the transaction has committed.
    _unsent: threading.local = field(default_factory=threading.local)

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
            self.driver.notify(conn, self.channel, payload)
        else:
            # No NOTIFY here: sent by datagram (see dbexecutor.doorbell) once the transaction commits.
            self.unsent().append(payload)

    def unsent(self) -> list[str]:
        """This thread's notifications waiting for their transaction to commit."""
        pending: list[str] | None = getattr(self._unsent, "payloads", None)
        if pending is None:
            pending = self._unsent.payloads = []
        return pending
