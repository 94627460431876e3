"""Waking other executors where the database cannot (SQLite, MySQL/MariaDB): a datagram to each.

PostgreSQL delivers a ``NOTIFY`` to every listening executor when a
transaction commits. The other databases have nothing like it, so each
executor there binds a UDP socket (loopback by default), records its address
in the registry, and after a transaction that made work ready or finished
jobs, the process that committed sends the same short text a ``NOTIFY``
would carry to every other live executor::

    commit ──► Doorbell.ring(payload) ──UDP──► other executors' loops ──► claim / resolve futures

Each executor reuses its list of whom to ring for a couple of seconds. A
new executor therefore rings everyone once as it starts (the ``h`` flag,
"hello"), and whoever hears it reads the list again at its next ring: the
newcomer hears of the very next change, not only of those after the list
expired.

A datagram can be lost, and nothing here retries: polling every
``poll_interval`` stays the backstop, as it is for ``NOTIFY``. A datagram
only makes an executor look at the database sooner; it carries no data that
is trusted, so a stray or forged one costs a read, nothing more.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["Doorbell"]

log = logging.getLogger("dbexecutor")

_PEERS_TTL = 2.0  # seconds the list of peers to ring is reused before it is read again
_MAX_DATAGRAM = 8192  # a notification payload is at most a few kilobytes


class Doorbell:
    """This process's UDP socket for wake-ups, and the ringing of the others'."""

    def __init__(self, host: str, peers: Callable[[], dict[str, str]]) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.setblocking(False)
        bound_host, port = self._sock.getsockname()[:2]
        #: Where a datagram reaches this process: ``host:port``.
        self.address = f"{bound_host}:{port}"
        self._peers = peers  # {name: host:port} of every live executor (a database read)
        self._lock = threading.Lock()
        self._cache: dict[str, str] = {}
        self._cached_at = -float("inf")
        self._closed = False

    def fileno(self) -> int:
        """The socket's descriptor (the loop waits on it with the children's pipes)."""
        return self._sock.fileno()

    def read(self) -> list[str]:
        """Every payload that has arrived (without waiting)."""
        got: list[str] = []
        while True:
            try:
                data = self._sock.recv(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError:
                return got
            got.append(data.decode("utf-8", "replace"))

    def ring(self, payloads: list[str], exclude: str) -> None:
        """Send each payload to every live executor but ``exclude`` (this one); never raises."""
        if not payloads or self._closed:
            return
        try:
            peers = self._targets(exclude)
        except Exception as error:  # noqa: BLE001 - the database may be down: polling covers it
            log.debug("could not read whom to wake (%s)", type(error).__name__)
            return
        for address in peers:
            host, _, port = address.rpartition(":")
            for payload in payloads:
                try:
                    self._sock.sendto(payload.encode(), (host, int(port)))
                except (OSError, ValueError):
                    break  # gone, or the buffer is full: its poll picks the work up

    def _targets(self, exclude: str) -> list[str]:
        with self._lock:
            if time.monotonic() - self._cached_at > _PEERS_TTL:
                self._cache = self._peers()
                self._cached_at = time.monotonic()
            return [addr for name, addr in self._cache.items() if name != exclude and addr]

    def hello(self, sender: str, exclude: str) -> None:
        """Say to every live executor that this one just registered: they add it to whom they ring (``sender``: the store's)."""
        self.ring([f"{sender}\th\t"], exclude)

    def forget_peers(self) -> None:
        """Read the peers again at the next ring (a new executor registered, or one stopped)."""
        with self._lock:
            self._cached_at = -float("inf")

    def close(self) -> None:
        """Close the socket."""
        self._closed = True
        self._sock.close()
