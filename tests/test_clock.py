"""Reading the database server's clock, and whether the tables exist, takes no lock that a writer could hold."""

from __future__ import annotations

import threading
import time

from sqlalchemy import update

from dbexecutor.store import Store


def test_a_store_opens_and_reads_while_another_connection_holds_a_write_transaction(db, store):
    # SQLite: the file's one write lock; the servers: a row lock on the meta table.
    meta = store.tables.meta
    with store.engine.connect() as writer:
        writer.execute(update(meta).where(meta.c.name == "vtime").values(value=meta.c.value))
        opened: list[float] = []

        def open_store() -> None:
            started = time.monotonic()
            other = Store(db.url, db.prefix, create=False)  # reads the clock as it opens
            other.sync_clock()
            assert other.schema_present()  # read-only commands ask this first
            opened.append(time.monotonic() - started)
            other.close()

        thread = threading.Thread(target=open_store, daemon=True)
        thread.start()
        # Before: SQLite's clock reading waited for the write lock (up to 30 s, then "database is locked").
        thread.join(10)
        assert opened and opened[0] < 10, "a read waited for the writer"
        writer.rollback()
    thread.join(40)
