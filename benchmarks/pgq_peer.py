"""PGQueuer on the drain scenario's workload: the peer reference on PostgreSQL.

::

    PGQUEUER_PREFIX=bench_x_ python -m benchmarks.pgq_peer install   DSN
    PGQUEUER_PREFIX=bench_x_ python -m benchmarks.pgq_peer enqueue   DSN N     # batched, 1,000 a statement
    PGQUEUER_PREFIX=bench_x_ python -m benchmarks.pgq_peer worker    DSN       # drains, then exits
    PGQUEUER_PREFIX=bench_x_ python -m benchmarks.pgq_peer uninstall DSN

Each prints one JSON line. A worker is one process with one asyncpg
connection and PGQueuer's defaults (batch size 10), its handler an ``async``
no-op that notes the wall clock; it runs in ``drain`` mode, so it exits once
the queue is empty. The table prefix keeps every object apart from anything
else in the database.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any


async def _connect(dsn: str) -> Any:
    import asyncpg

    return await asyncpg.connect(dsn)


async def _queries(dsn: str) -> tuple[Any, Any]:
    from pgqueuer import AsyncpgDriver, Queries

    conn = await _connect(dsn)
    return conn, Queries(AsyncpgDriver(conn))


async def install(dsn: str) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        await q.install()
    finally:
        await conn.close()
    return {"ok": True}


async def uninstall(dsn: str) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        await q.uninstall()
    finally:
        await conn.close()
    return {"ok": True}


async def enqueue(dsn: str, n: int, batch: int = 1000) -> dict[str, Any]:
    conn, q = await _queries(dsn)
    try:
        t0 = time.time()
        left = n
        while left > 0:
            k = min(batch, left)
            await q.enqueue(["noop"] * k, [None] * k, [0] * k)
            left -= k
        t1 = time.time()
    finally:
        await conn.close()
    return {"start": t0, "end": t1}


async def worker(dsn: str) -> dict[str, Any]:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    started = time.time()
    conn = await _connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    seen: dict[str, Any] = {"count": 0, "first_done": None, "last_done": None}

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        now = time.time()
        seen["count"] += 1
        seen["first_done"] = seen["first_done"] or now
        seen["last_done"] = now

    try:
        await qm.run(mode=QueueExecutionMode.drain)
    finally:
        await conn.close()
    return {"started": started, **seen}


def main(argv: list[str]) -> int:
    command, dsn, *rest = argv
    work = {"install": install, "uninstall": uninstall, "enqueue": enqueue, "worker": worker}[command]
    args = [int(x) for x in rest]
    print(json.dumps(asyncio.run(work(dsn, *args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
