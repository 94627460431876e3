"""Free slots the loop lends to submitting threads: a durable submit goes in leased, and starts without a claim.

::

    loop, after each tick ──publish(free slots, scope)──► Lending ◄──lend()── a durable submit's thread
                                                            │                    │ INSERT ... leased if it is the
    loop, next tick ◄──take(): jobs to hand to children ────┤                    │ only runnable job in scope
                                                            └◄──land(claim)──────┘ (or None: it went in ready)

A durable submit writes its row in the submitting thread. Without this the
loop then needs a transaction of its own to claim the row it was just told
of; with a slot lent, the insert itself leases the row (when a claim could
have picked nothing else, as a tick's own insert does) and the loop only
hands it to a child. Every slot lent is counted until it lands, so the
loop's own claims leave it free. The loop publishes after each tick what
it may lend; between two ticks that estimate only shrinks, so a slot is
never lent twice. Once the loop has stopped it lends nothing, and a claim
that lands after that is the submitting thread's to give back.

Only where writers take turns (``Driver.leases_durable_submits``: SQLite),
where the claim saved is a write lock the submit would have waited for; on a
server the loop's claim runs beside the submit, and leasing in the insert
would only make the submit longer.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from .records import Claimed
from .store.sql import Scope

__all__ = ["Lease", "Lending"]


class Lease(NamedTuple):
    """What a submitting thread needs to insert a row leased for this executor: the owner, the TTL, the claim's scope."""

    owner: str
    ttl: float
    scope: Scope


class Lending:
    """Slots lent to submitting threads, and the jobs their inserts leased (thread-safe)."""

    def __init__(self, owner: str, ttl: float) -> None:
        self._owner = owner
        self._ttl = ttl
        self._lock = threading.Lock()
        self._free = 0  # slots the loop said were free at its last tick, minus those lent since
        self._scope = Scope()
        self._out = 0  # lent, insert not done yet
        self._landed: list[Claimed] = []  # leased by an insert, not taken by the loop yet
        self._closed = False

    def publish(self, free: int, scope: Scope) -> None:
        """The loop, after a tick: ``free`` slots are free of its own jobs (lent ones not counted), for claims in ``scope``."""
        with self._lock:
            # Counted here, under the lock: a slot lent while the loop counted is not lent again.
            self._free = max(0, free - self._out - len(self._landed))
            self._scope = scope

    def lend(self) -> Lease | None:
        """A slot for one insert leased on arrival, or None (none free, or the loop stopped)."""
        with self._lock:
            if self._closed or self._free <= 0:
                return None
            self._free -= 1
            self._out += 1
            return Lease(self._owner, self._ttl, self._scope)

    def land(self, claimed: Claimed | None) -> bool:
        """The insert a slot was lent for ended: ``claimed`` if its row went in leased. False: the loop has stopped.

        With False and a claim, the caller gives the lease back (the loop will not run it).
        """
        with self._lock:
            self._out -= 1
            if self._closed:
                return False
            if claimed is not None:
                self._landed.append(claimed)
            else:
                self._free += 1  # not used: lendable again until the next tick says otherwise
            return True

    def in_use(self) -> int:
        """Slots lent or landed and not taken by the loop yet: the loop's own claims leave them free."""
        with self._lock:
            return self._out + len(self._landed)

    def take(self) -> list[Claimed]:
        """The jobs inserts leased since the last call, for the loop to hand to children."""
        with self._lock:
            landed, self._landed = self._landed, []
            return landed

    def close(self) -> list[Claimed]:
        """Lend nothing from now on (the loop is ending); the jobs leased and not taken, for it to give back."""
        with self._lock:
            self._closed = True
            self._free = 0
            landed, self._landed = self._landed, []
            return landed
