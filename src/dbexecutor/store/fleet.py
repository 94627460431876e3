"""The registry of executors: who serves the database, which of them are alive, and rescuing the jobs of the dead.

Every executor, standalone worker and submit-only process registers a row
(host, pid, start time, version, slots, where a datagram wakes it) and beats
on its heartbeat interval, in the transaction that renews the leases of all
its jobs. Its jobs name it as their ``lease_owner``. One that stops cleanly
marks itself stopped. One that dies stops beating: after ``lease_ttl`` its
jobs' leases have run out and anyone reclaims them; and on its own machine
any other executor knows at once that its process is gone (:func:`dead_here`, :func:`rescue`),
so its jobs go back to ready within seconds, not a TTL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from sqlalchemy import Connection

from ..readmodels import ExecutorInfo
from ..records import Registration
from . import control
from .context import Context, chunks
from .transitions import AttemptRow, record_attempts

__all__ = ["register", "beat", "stop", "listed", "dead_here", "rescue", "forget", "wake_addresses"]

#: Tells whether a process of this machine is alive: ``(pid, pid_started) -> bool``.
Liveness = Callable[[int, "float | None"], bool]


def register(ctx: Context, conn: Connection, reg: Registration, ttl: float, now: float) -> None:
    """Add a registration, alive until ``now + ttl`` unless it beats."""
    params = {f"p_{k}": v for k, v in asdict(reg).items()}
    params["p_queues"] = None if reg.queues is None else ",".join(reg.queues)
    params.update(p_started_at=now, p_last_beat=now, p_expires=now + ttl)
    conn.execute(ctx.sql.register, params)


def beat(ctx: Context, conn: Connection, name: str, ttl: float, now: float) -> bool:
    """Executor ``name`` is alive; False if its row is gone (forgotten while it could not beat)."""
    return bool(conn.execute(ctx.sql.executor_beat, {"p_name": name, "p_now": now, "p_expires": now + ttl}).rowcount == 1)


def stop(ctx: Context, conn: Connection, name: str, now: float) -> None:
    """Executor ``name`` stopped."""
    conn.execute(ctx.sql.executor_stopped, {"p_name": name, "p_now": now})


def listed(ctx: Context, conn: Connection, now: float, host: str, alive_here: Liveness) -> list[ExecutorInfo]:
    """Every registration, newest first, with what it holds and whether it is alive (exactly, on ``host``)."""
    out: list[ExecutorInfo] = []
    for r in conn.execute(ctx.sql.executors_listed):
        gone_here = r.host == host and r.stopped_at is None and not alive_here(r.pid, r.pid_started)
        alive = r.stopped_at is None and r.expires > now and not gone_here
        rescue_in = None
        if not alive and r.running:
            # Found dead on its machine: rescued at the next look; else when its leases run out.
            rescue_in = 0.0 if gone_here else max(0.0, r.expires - now)
        out.append(
            ExecutorInfo(
                name=r.name, kind=r.kind, host=r.host, pid=int(r.pid), version=r.version, slots=int(r.slots),
                queues=None if r.queues is None else [q for q in r.queues.split(",") if q],
                started_at=r.started_at, last_beat=r.last_beat, stopped_at=r.stopped_at, running=int(r.running),
                alive=alive, age=max(0.0, now - r.started_at), since_beat=max(0.0, now - r.last_beat),
                rescue_in=rescue_in,
            )
        )
    return out


def dead_here(ctx: Context, conn: Connection, host: str, alive_here: Liveness) -> list[str]:
    """The executors of ``host`` not marked stopped whose process is gone (a read)."""
    return [r.name for r in conn.execute(ctx.sql.executors_here, {"p_host": host}) if not alive_here(r.pid, r.pid_started)]


def rescue(ctx: Context, conn: Connection, dead: list[str], now: float) -> dict[str, list[int]]:
    """Mark the executors ``dead`` stopped and put the jobs they held back to ready.

    Returns ``{dead executor's name: ids of the jobs rescued from it}``.
    """
    found = conn.execute(ctx.sql.jobs_held_by, {"p_names": dead}).all()
    # A job its owner was asked to stop ends cancelled rather than running again.
    stopping = [r for r in found if r.terminate_requested is not None]
    _, finals = control.end_stopped(
        ctx, conn, stopping, now, "asked to stop; its executor died before it stopped it"
    ) if stopping else ([], [])
    rows = [r for r in found if r.terminate_requested is None]
    for part in chunks([int(r.id) for r in rows]):
        conn.execute(ctx.sql.rescue, {"p_ids": list(part), "p_names": dead})
    record_attempts(
        ctx,
        conn,
        [
            AttemptRow(
                int(r.id), r.attempt, r.lease_owner, r.started_at, now, "executor died",
                f"the process of executor {r.lease_owner} is gone; the job was put back to ready",
            )
            for r in rows
        ],
    )
    for name in dead:
        stop(ctx, conn, name, now)
    ctx.notify(conn, ready=bool(rows), finished=[f.job_id for f in finals])
    rescued: dict[str, list[int]] = {name: [] for name in dead}
    for r in rows:
        rescued[r.lease_owner].append(int(r.id))
    return rescued


def forget(ctx: Context, conn: Connection, cutoff: float) -> int:
    """Delete registrations dead since before ``cutoff`` that hold no job; how many."""
    return int(conn.execute(ctx.sql.forget_executors, {"p_cutoff": cutoff}).rowcount)


def wake_addresses(ctx: Context, conn: Connection, now: float) -> dict[str, str]:
    """``{name: host:port}`` of every live executor that can be woken by a datagram."""
    return {r.name: r.wake for r in conn.execute(ctx.sql.wake_addresses, {"p_now": now})}
