"""The store: every statement dbexecutor runs, behind one small front.

::

    Store (this module)          one method per operation; opens the transaction
      ├─ database.Database       engine, transactions, retry on transient errors
      ├─ context.Context         tables, driver, statements, signer, notifications
      ├─ sql.Statements          the catalogue: every statement, by name
      ├─ migrations              create tables, upgrade older versions
      ├─ submit                  rows, edges, groups, lease on insert
      ├─ through                 submitting inside the caller's transaction
      ├─ claim (+ fairshare)     leasing runnable jobs, fair across groups
      ├─ finish                  done / retried / failed, attempt rows
      ├─ tick                    a scheduler's tick: insert, finish, claim in one transaction
      ├─ dag                     readiness, failure, cancellation, batches, revival
      ├─ leases                  renew, release, reclaim
      ├─ reads                   what executors read back
      ├─ control                 progress of running jobs, stopping them where they run
      ├─ admin                   what operators read and change
      └─ console.Console         the operators' front (``store.console``): their reads and bulk actions

Each state change is a conditional ``UPDATE``: writes on behalf of an attempt
are fenced by ``(id, attempt)`` and an active state (``transitions``), so an
attempt that lost its lease changes nothing when it reports late. Readiness,
failure propagation and cancellation of dependents happen in the transaction
that finishes the upstream job, so the claim only ever reads ``ready`` rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any, TypeVar

from sqlalchemy import Connection, inspect
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from .. import schema, serialization
from ..dialects import Driver, resolve
from ..errors import ConfigurationError
from ..readmodels import ExecutorInfo, GroupInfo, JobProgress, StopRequest
from ..records import Claimed, Final, Finished, NewJob, Registration, Renewal, Report, Submitted
from .. import hosts
from . import admin, claim, control, dag, fleet, landed, leases, migrations, reads, submit, through, tick
from .clock import Clock
from .console import Console
from .context import Context
from .functions import FunctionTable
from . import functions as stored_functions
from .database import MAX_TRIES, Database, Hold, masked_url
from .migrations import SchemaReport
from .sql import DEFAULT_SCOPE, Scope, Statements

__all__ = ["Store", "SchemaReport", "masked_url", "worker_name"]

#: What an idle look's transaction returns: its leases, whether it left nothing runnable, what its late reports changed, those reports.
_Looked = tuple[list[Claimed], bool, Finished, list[Report]]

T = TypeVar("T")


def worker_name(pid: int) -> str:
    """``host:pid``, how attempts and leases name the process that holds them (the host as registrations name it)."""
    # Read once per process (hosts): asking the kernel for every result was 3% of the loop.
    return f"{hosts.hostname()}:{pid}"


class Store:
    """The database behind one executor, worker or command: engine, tables and every operation on them."""

    #: ``configure_group(limit=KEEP)`` leaves the limit as it is.
    KEEP: Any = admin.KEEP

    def __init__(
        self,
        url: Any,
        prefix: str = "",
        *,
        create: bool = True,
        pool_size: int | None = None,
        signer: serialization.Signer | None = None,
        listen_url: Any = None,
    ) -> None:
        self.driver: Driver = resolve(url)
        #: Where :meth:`listen` connects, if not at ``url`` (PostgreSQL): a
        #: direct URL of the server when ``url`` goes through a transaction pooler.
        self.listen_url: URL | None = None
        if listen_url is not None:
            listener = resolve(listen_url)
            if not (self.driver.supports_notify and listener.supports_notify):
                raise ConfigurationError(
                    "listen_url is for PostgreSQL, whose executors LISTEN for wake-ups: a postgresql:// URL of "
                    "the same database, reached directly, when the database URL goes through a pooler such as PgBouncer"
                )
            self.listen_url = listener.url
        self.prefix = schema.validate_prefix(prefix)
        self.tables = self.driver.make_tables(prefix)
        self._db = Database(self.driver, pool_size=pool_size)
        self.ctx = Context(
            tables=self.tables,
            driver=self.driver,
            sql=Statements(self.tables, self.driver),
            signer=signer or serialization.UNSIGNED,
            prefix=self.prefix,
            clock=Clock(),
        )
        self.sync_clock()
        #: What opening the tables did (None with ``create=False``).
        self.schema_report: SchemaReport | None = self.ensure_schema() if create else None
        # Once: every future carries it, and rendering the URL per submit shows up.
        self._identity = (masked_url(self.url), self.prefix)
        self._database_identity: tuple[Any, ...] | None = None  # read on first use (check_same_database)

    def __repr__(self) -> str:
        return f"Store({masked_url(self.url)!r}, prefix={self.prefix!r})"

    @property
    def url(self) -> URL:
        """The URL, pinned to dbexecutor's DBAPI driver."""
        return self.driver.url

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (a small pool)."""
        return self._db.engine

    @property
    def signer(self) -> serialization.Signer:
        """Signs the exceptions the store writes and checks the ones it reads."""
        return self.ctx.signer

    @property
    def sender(self) -> str:
        """Names this store's notifications, so a listener can skip its own."""
        return self.ctx.sender

    @property
    def identity(self) -> tuple[str, str]:
        """Which database and table prefix this is (futures from the same one can be dependencies)."""
        return self._identity

    def close(self) -> None:
        """Close every pooled connection."""
        self._db.close()

    # -- the clock ------------------------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        """The database server's clock (see :mod:`dbexecutor.store.clock`)."""
        return self.ctx.clock

    def now(self) -> float:
        """The database server's time now, as epoch seconds (no round trip)."""
        return self.ctx.clock.now()

    def sync_clock(self, *, force: bool = True) -> None:
        """Measure the server clock's offset again (a few round trips); with ``force=False`` only when it is due."""
        clock = self.ctx.clock
        if not (force or clock.due):
            return
        with self.engine.connect() as conn:
            # Autocommit: each reading is one round trip, with no transaction around it. A read
            # (SQLite: a deferred BEGIN, not the write lock, which a busy or frozen writer may hold).
            conn = conn.execution_options(isolation_level="AUTOCOMMIT", dbexecutor_read_only=True)
            clock.sync(lambda: self.driver.server_time(conn))

    def retry_later(self, error: DBAPIError) -> bool:
        """Whether ``error`` is the database's state (down, busy, restarting) rather than a refused row."""
        return self._db.retry_later(error)

    #: Called with the notifications a transaction made, after it committed, where the database
    #: cannot deliver them itself (no NOTIFY): the scheduler rings its doorbell with them.
    after_commit: Callable[[list[str]], None] | None = None
    #: Whether this store's last committed look for work (:meth:`claim`, :meth:`finish_and_claim`)
    #: left nothing runnable in its scope, and no :meth:`finish_and_claim` since made anything
    #: runnable. Other writes (releases, reclaims, other threads and processes) do not clear
    #: it: a hint for the scheduler, which hears of those and decides whether to trust it.
    drained: bool = False

    def holding_connection(self, hold: Hold | None = None) -> AbstractContextManager[None]:
        """While inside, this thread's transactions reuse one pooled connection (see ``Database.holding``).

        ``hold`` (from :meth:`new_hold`): the connection is kept on leaving, for the next block that names it.
        """
        return self._db.holding(hold)

    def new_hold(self, *, autocommit: bool = False) -> Hold:
        """A connection to keep between transactions of several threads taken in turn (see :meth:`holding_connection`)."""
        return Hold(autocommit)

    def release_hold(self, hold: Hold) -> None:
        """Give ``hold``'s connection back to the pool."""
        self._db.release(hold)

    def transaction(
        self,
        work: Callable[[Connection], T],
        *,
        read_only: bool = False,
        tries: int = MAX_TRIES,
        one_write: bool = False,
        landed: Callable[[Connection, T | None], T | None] | None = None,
    ) -> T:
        """Run ``work(conn)`` in one transaction, tried again on a transient error; what it returns.

        Every operation of the store, and of its :attr:`console`, goes
        through here: the held connection or the pool's, the retries, and
        the notifications the transaction owes, sent once it committed.
        ``read_only``: no write lock is taken (SQLite) and nothing is
        notified; ``one_write``: ``work`` sends a single write, which may
        run in autocommit where the database makes that cheaper; ``landed``:
        whether a try whose ``COMMIT`` failed was committed all the same
        (see :meth:`Database.txn`).
        """
        unsent = self.ctx.unsent()

        def attempt(conn: Connection) -> T:
            unsent.clear()  # a transaction tried again notifies afresh
            return work(conn)

        out = self._db.txn(attempt, read_only=read_only, tries=tries, one_write=one_write, landed=landed)
        if unsent:
            payloads = list(unsent)
            unsent.clear()
            if self.after_commit is not None:
                self.after_commit(payloads)
        return out

    # -- schema ---------------------------------------------------------------------------------------

    def ensure_schema(self) -> SchemaReport:
        """Create the tables if missing, upgrade older versions, refuse newer ones (safe when processes race)."""
        return self.transaction(lambda conn: migrations.ensure_schema(self.ctx, conn))

    def migrate(self) -> SchemaReport:
        """:meth:`ensure_schema`, then the indexes a later release added to existing tables."""
        report = self.ensure_schema()
        report.created_indexes = self.transaction(lambda conn: migrations.create_missing_indexes(self.ctx, conn))
        return report

    def schema_present(self) -> bool:
        """Whether this prefix's tables exist (read-only commands refuse to run without them)."""
        with self.engine.connect() as conn:
            # A read (SQLite: a deferred BEGIN, not a wait for the write lock a writer may hold).
            return bool(inspect(conn.execution_options(dbexecutor_read_only=True)).has_table(self.tables.jobs.name))

    def drop_schema(self) -> None:
        """Drop this prefix's tables (tests and tooling)."""
        self.tables.metadata.drop_all(self.engine, checkfirst=True)

    # -- notifications --------------------------------------------------------------------------------

    def listen(self, callback: Callable[[str | None], None], stop: threading.Event) -> threading.Thread | None:
        """Call ``callback`` for each notification on this store's channel; None where the database has none."""
        if not self.driver.supports_notify:
            return None
        return self.driver.listen(self.engine, self.ctx.channel, callback, stop, self.listen_url)

    # -- groups ---------------------------------------------------------------------------------------

    def configure_group(self, name: str, *, weight: int | None = None, limit: Any = KEEP) -> GroupInfo:
        """Create or change a group: its weight, and its limit (``None``: unlimited) unless left out."""
        info: GroupInfo = self.transaction(lambda conn: admin.configure_group(self.ctx, conn, name, weight, limit))
        self.ctx.groups_seen[name] = info.weight
        return info

    def groups(self) -> list[GroupInfo]:
        """Every group, by name."""
        return self.transaction(lambda conn: admin.groups(self.ctx, conn), read_only=True)

    # -- submit ---------------------------------------------------------------------------------------

    def insert_job(self, job: NewJob, now: float) -> Submitted:
        """Insert one job and its edges; with a taken key, return the existing job instead.

        A batch (``job.batch``) whose children have all finished is rolled up at once.
        """
        try:
            out, groups = self.transaction(lambda conn: submit.insert_job(self.ctx, conn, job, now))
        except IntegrityError:
            if job.key is None:
                raise
            # Another process inserted the same key between our lookup and insert.
            found = self.transaction(lambda conn: submit.by_key(self.ctx, conn, job.key), read_only=True)  # type: ignore[arg-type]
            if found is None:
                raise
            return found
        submit.groups_done(self.ctx, groups)
        return out

    def insert_jobs(self, jobs: Sequence[NewJob], now: float) -> list[Submitted]:
        """Insert many rows without keys in one transaction; rows in input order."""
        if not jobs:
            return []

        def work(conn: Connection) -> tuple[list[Submitted], dict[str, int | None]]:
            groups = submit.ensure_groups(self.ctx, conn, jobs)
            notice = submit.arrival_notice(self.ctx, conn, jobs, now)  # sent by the insert itself, where it can be
            out = submit.insert_many(self.ctx, conn, jobs, now, notice=notice)
            submit.notify_changes(self.ctx, conn, jobs, out, now, carried=notice)
            return out, groups

        def made(
            conn: Connection, out: tuple[list[Submitted], dict[str, int | None]] | None
        ) -> tuple[list[Submitted], dict[str, int | None]] | None:
            # In autocommit (one_write) the insert may have landed without its try returning.
            rows = landed.submitted(self.ctx, conn, jobs, now, out[0] if out is not None else None)
            return None if rows is None else (rows, out[1] if out is not None else {})

        out, groups = self.transaction(work, one_write=submit.one_write(self.ctx, jobs), landed=made)
        submit.groups_done(self.ctx, groups)
        return out

    def rows_created(self, at: float, jobs: Sequence[NewJob]) -> list[Submitted] | None:
        """The rows of ``jobs`` (no keys) if a write at ``at`` stored them (its ``COMMIT`` may not have answered), else None."""
        return self.transaction(lambda conn: landed.submitted(self.ctx, conn, jobs, at, None), read_only=True)

    def insert_leasing(self, job: NewJob, now: float, owner: str, ttl: float, scope: Scope) -> tuple[Submitted, list[Claimed]]:
        """Insert one job, leased to ``owner`` if nothing else in ``scope`` could be claimed before it; the row and its claim.

        For a submitting thread that holds a free slot of its executor (a
        durable submit): the job starts without a claim of its own. A job
        the claim could not take at once (an upstream, a key, a delay,
        another queue), or one that something else runnable comes before,
        goes in as :meth:`insert_jobs` writes it, and no claim is returned.
        """
        if not submit.claimable_on_arrival(job, now, scope):
            return self.insert_jobs([job], now)[0], []
        ctx = self.ctx

        def work(conn: Connection) -> tuple[Submitted, dict[str, int | None]]:
            groups = submit.ensure_groups(ctx, conn, [job])
            row = submit.insert_leased(ctx, conn, job, owner, ttl, now, scope)
            submit.notify_changes(ctx, conn, [job], [row], now, taken=[row.job_id] if row.state == schema.LEASED else ())
            return row, groups

        def made(
            conn: Connection, out: tuple[Submitted, dict[str, int | None]] | None
        ) -> tuple[Submitted, dict[str, int | None]] | None:
            rows = landed.submitted(ctx, conn, [job], now, [out[0]] if out is not None else None)
            return None if rows is None else (rows[0], out[1] if out is not None else {})

        # One statement where the insert reads back what it wrote (RETURNING), as a durable submit's plain insert.
        one = submit.one_write(ctx, [job]) and self.driver.insert_returning
        row, groups = self.transaction(work, one_write=one, landed=made)
        submit.groups_done(ctx, groups)
        return row, submit.leased_on_insert([job], [row])

    # -- submit inside the caller's transaction -------------------------------------------------------

    def check_same_database(self, conn: Connection) -> None:
        """Refuse (``ConfigurationError``) a caller's connection that does not reach this store's database.

        The identity (see :meth:`Driver.database_identity`) is read once per
        pooled connection and kept in its ``info``.
        """
        if self._database_identity is None:
            # Read-only: on SQLite the caller's transaction may hold the write lock already.
            self._database_identity = self.transaction(self.driver.database_identity, read_only=True)
        through.refuse_other(self.ctx, conn, self._database_identity, masked_url(self.url))

    def insert_through(
        self, conn: Connection, jobs: Sequence[NewJob], now: float
    ) -> tuple[list[Submitted], list[str], dict[str, int | None]]:
        """Insert ``jobs`` (keyed or not, in order) through a caller's connection, in its open transaction.

        Nothing is committed here and nothing is tried again: the transaction
        is the caller's. Returns the rows, the notifications to send once it
        commits (databases without NOTIFY; PostgreSQL's are queued in the
        transaction itself), and the groups written (for :meth:`groups_written`).
        """
        return through.insert(self.ctx, conn, jobs, now)

    def groups_written(self, groups: dict[str, int | None]) -> None:
        """The transaction that wrote ``groups`` (from :meth:`insert_through`) committed."""
        submit.groups_done(self.ctx, groups)

    def existing(self, job_ids: Sequence[int]) -> set[int]:
        """Which of ``job_ids`` have a committed row."""
        return self.read(reads.existing, job_ids)

    # -- claim and the scheduler's tick ---------------------------------------------------------------

    def runnable_groups(self, now: float, scope: Scope = DEFAULT_SCOPE) -> list[str]:
        """Names of the groups with runnable work in ``scope`` (a read that takes no write lock)."""
        return self.transaction(lambda conn: claim.runnable_groups(self.ctx, conn, now, scope), read_only=True)

    def claim(
        self,
        owner: str,
        limit: int,
        ttl: float,
        now: float,
        *,
        probe: bool = True,
        scope: Scope = DEFAULT_SCOPE,
    ) -> list[Claimed]:
        """Lease up to ``limit`` ready jobs of ``scope`` in one transaction: fair share over groups, then priority, then age.

        With ``probe``, looks first, without a write lock, whether anything is
        runnable: an idle poll is one indexed read, also on SQLite. Without it
        (work is known to be there), one round trip less.
        """
        return self.look(owner, limit, ttl, now, probe=probe, scope=scope)[0]

    def look(
        self,
        owner: str,
        limit: int,
        ttl: float,
        now: float,
        *,
        probe: bool = True,
        scope: Scope = DEFAULT_SCOPE,
        before_commit: tick.BeforeCommit | None = None,
    ) -> tuple[list[Claimed], Finished]:
        """An idle tick's look: :meth:`claim`, and what the jobs it handed out early changed before its ``COMMIT``.

        ``before_commit``: as in :meth:`finish_and_claim`. The jobs it starts
        that end before this transaction's ``COMMIT`` are recorded by it
        (and what they made runnable leased in it): a job from another
        process, or a worker's first job, takes one transaction, not two.
        Returns what it leased and what the recorded jobs changed.
        """
        if limit <= 0:
            return [], Finished()
        self.drained = False  # until a committed look says otherwise
        if probe and not self.runnable_groups(now, scope):
            self.ctx.backlog = False
            self.drained = True
            return [], Finished()
        ctx = self.ctx

        def work(conn: Connection) -> _Looked:
            # Work is there: the probe saw it, or the caller knows of it.
            got, drained = claim.claim(ctx, conn, owner, limit, ttl, now, scope, likely=True)
            done = Finished()
            more, late = tick.record_late(ctx, conn, owner, ttl, scope, got, done, before_commit)
            if late:
                if done.released or done.retried or done.refused:
                    drained = False  # perhaps the late reports made work runnable, after the claim
                # Their submitters (other processes, as a look's work mostly is) hear of them at the commit.
                submit.notify_changes(ctx, conn, [], [], now, done, taken={c.job_id for c in more})
            return got + more, drained, done, late

        def made(conn: Connection, out: _Looked | None) -> _Looked | None:
            return out if out is not None and landed.tick(ctx, conn, now, owner, [], [], out[0], out[3]) else None

        claimed, drained, done, _ = self.transaction(work, landed=made)
        ctx.backlog = len(claimed) >= limit
        self.drained = drained
        return claimed, done

    def finish_and_claim(
        self,
        reports: Sequence[Report],
        owner: str,
        limit: int,
        ttl: float,
        now: float,
        new: Sequence[NewJob] = (),
        scope: Scope = DEFAULT_SCOPE,
        *,
        look: bool = True,
        before_commit: tick.BeforeCommit | None = None,
        unsure: bool = False,
    ) -> tuple[list[Submitted], Finished, list[Claimed]]:
        """One scheduler tick in one commit: insert ``new`` jobs, record how attempts ended, then claim.

        The new rows are inserted first, so the claim can lease them at once:
        a job submitted to an idle executor starts after a single commit.
        New jobs runnable at once, all of one group, written by a tick with
        free slots and nothing to record (a submit, a ``map``), go in leased
        when the claim could pick nothing else: one job by one ``INSERT``
        that checks and leases; a burst after one cheap read (skipped while
        the last claim left work behind, when it would only find that again).
        ``scope``: the queues this executor serves and the functions it skips.

        ``look=False``: the caller knows that nothing was runnable a moment
        ago and has heard of nothing since (see :attr:`drained`). With no new
        rows, the claim is then skipped, one statement less, unless these
        reports themselves made jobs runnable (dependents released, retries,
        refusals).

        ``before_commit``: called with what this transaction claimed and
        finished, after its last statement and before its ``COMMIT`` (so that
        the jobs start while the commit is written). It is called again if
        the transaction is tried again, and the commit may still fail: the
        caller must be able to take back what it did with them. It returns
        the reports of those jobs that already ended (it may wait a moment
        for them): they are recorded by this transaction, what they changed
        is in the ``Finished`` returned, and the jobs they made runnable are
        leased and handed to it again (:func:`tick.record_late`).

        ``unsure``: these reports were sent before, in a tick whose ``COMMIT``
        failed, and may have been recorded (the answer lost with the
        connection): this transaction leaves out those that were
        (:func:`finish.recorded_before`). Within this call, a try whose
        ``COMMIT`` failed and that was made all the same is not written
        again (:func:`landed.tick`).
        """
        ctx = self.ctx
        lease_new = tick.may_lease_new(reports, new, limit, now, scope)

        def work(conn: Connection) -> tick.Tick:
            return tick.tick(
                ctx, conn, reports, owner, limit, ttl, now, new, scope,
                lease_new=lease_new, look=look, unsure=unsure, before_commit=before_commit,
            )

        def made(conn: Connection, out: tick.Tick | None) -> tick.Tick | None:
            return out if out is not None and landed.tick(ctx, conn, now, owner, reports, out.inserted, out.claimed, out.late) else None

        before, self.drained = self.drained, False  # until the commit says otherwise
        inserted, done, claimed, groups, drained, _ = self.transaction(work, landed=made)
        submit.groups_done(ctx, groups)
        # A hint only (other processes add work too): whether runnable rows
        # are likely left, so that the next burst need not look.
        ctx.backlog = limit > 0 and len(claimed) >= limit
        self.drained = before if drained is None else drained
        return inserted, done, claimed

    def explain_claim(self, limit: int = 4, scope: Scope = DEFAULT_SCOPE) -> dict[str, list[str]]:
        """The database's plans for the claim's statements, one line per plan row (for tests and tuning).

        ``groups``: which groups have runnable work; ``claim``: one group's best
        rows; ``lease``: the UPDATE that leases them (explained, not run);
        ``alone``: the statement that leases (or, without ``UPDATE ...
        RETURNING``, picks) a group's best rows if it is the only choice.
        ``scope``: the queues the claiming executor serves.
        """
        now = time.time()
        return self.transaction(lambda conn: claim.explain(self.ctx, conn, now, limit, scope))

    # -- leases ---------------------------------------------------------------------------------------

    def renew_leases(
        self,
        held: Sequence[tuple[int, int]],
        started: AbstractSet[int],
        ttl: float,
        now: float,
        progress: Mapping[tuple[int, int], tuple[float | None, str | None]] | None = None,
    ) -> Renewal:
        """Extend the leases of ``held`` ``(job_id, attempt)`` pairs; mark the ``started`` ones running.

        One statement per 500 jobs, whatever their state: an executor's writes
        for its leases do not grow with its children. Guarded by the attempt
        token and an active state. ``progress``: the latest ``(fraction,
        message)`` each running attempt reported, written in the same
        transaction. Returns the ids whose lease is gone (reclaimed after it
        expired, or finished elsewhere) and those someone asked to stop.
        """
        if not held:
            return Renewal()
        return self.transaction(lambda conn: leases.renew(self.ctx, conn, held, started, ttl, now, progress), tries=3)

    def heartbeat(self, job_id: int, attempt: int, ttl: float, now: float) -> bool:
        """Renew the lease of ``(job_id, attempt)`` and mark it running; False if the lease is gone."""
        return job_id not in self.renew_leases([(job_id, attempt)], {job_id}, ttl, now).lost

    def renew(self, held: Sequence[tuple[int, int]], ttl: float, now: float) -> None:
        """Extend the leases of claimed jobs that no child has started yet."""
        self.renew_leases(held, frozenset(), ttl, now)

    def release(self, job_id: int, attempt: int) -> bool:
        """Give back a claimed job that never started (its child could not start); False if not held."""
        return self.transaction(lambda conn: leases.release(self.ctx, conn, job_id, attempt))

    def reclaim_expired(self, now: float) -> list[int]:
        """Put jobs whose lease expired (their executor or child died) back to ``ready``."""
        return self.transaction(lambda conn: leases.reclaim_expired(self.ctx, conn, now))

    def release_unknown(self, owner: str, known: set[tuple[int, int]], now: float) -> list[int]:
        """Give back the jobs leased to ``owner`` that it does not know it holds (``known``): ids given back.

        For an executor whose claim's ``COMMIT`` failed: it may have been
        made all the same, its answer lost (see :func:`leases.release_unknown`).
        """
        return self.transaction(lambda conn: leases.release_unknown(self.ctx, conn, owner, known, now))

    def release_running(self, held: Sequence[tuple[int, int, float | None]], worker: str, now: float, why: str) -> list[int]:
        """Put jobs a stopping worker still holds back to ``ready``; ids released (see :func:`leases.release_held`)."""
        return self.transaction(lambda conn: leases.release_held(self.ctx, conn, held, worker, now, why))

    # -- the registry of executors --------------------------------------------------------------------

    def register(self, reg: Registration, ttl: float) -> None:
        """Register an executor, worker or submit-only process (alive for ``ttl`` unless it beats).

        On PostgreSQL the registration says hello (a ``NOTIFY``), so that the
        others notify it from now on; from then on this store notifies only
        while another executor is alive to hear it (see :meth:`Context.heard`).
        """

        def work(conn: Connection) -> None:
            fleet.register(self.ctx, conn, reg, ttl, self.now())
            self.ctx.hello(conn)

        self.transaction(work)
        self.ctx.owner = reg.name

    def forget_peers(self) -> None:
        """Another executor said hello (or anything may have happened): look again whether one hears a ``NOTIFY``."""
        self.ctx.forget_peers()

    def beat(
        self,
        reg: Registration,
        held: Sequence[tuple[int, int]],
        started: AbstractSet[int],
        ttl: float,
        progress: Mapping[tuple[int, int], tuple[float | None, str | None]] | None = None,
    ) -> Renewal:
        """One heartbeat of an executor: its registration and the leases of all its jobs, in one transaction.

        ``held``/``started``/``progress`` as in :meth:`renew_leases`; returns
        the ids whose lease is gone and those asked to stop. A registration
        that was forgotten meanwhile is made again.
        """

        def work(conn: Connection) -> Renewal:
            now = self.now()
            if not fleet.beat(self.ctx, conn, reg.name, ttl, now):
                fleet.register(self.ctx, conn, reg, ttl, now)
            return leases.renew(self.ctx, conn, held, started, ttl, now, progress) if held else Renewal()

        return self.transaction(work, tries=3)

    def unregister(self, name: str) -> None:
        """The executor ``name`` stopped (its row stays a while, for ``dbexecutor workers``)."""
        self.transaction(lambda conn: fleet.stop(self.ctx, conn, name, self.now()))

    def executors(self) -> list[ExecutorInfo]:
        """Every registered executor, newest first, alive or dead, with the jobs it holds."""
        return self.transaction(
            lambda conn: fleet.listed(self.ctx, conn, self.now(), hosts.hostname(), hosts.process_alive), read_only=True
        )

    def rescue_dead_here(self) -> dict[str, list[int]]:
        """Rescue the jobs of executors on this machine whose process is gone: ``{name: job ids}``."""
        # A read first (on SQLite a write transaction takes the one write lock): usually nobody died.
        dead = self.transaction(
            lambda conn: fleet.dead_here(self.ctx, conn, hosts.hostname(), hosts.process_alive), read_only=True
        )
        if not dead:
            return {}
        return self.transaction(lambda conn: fleet.rescue(self.ctx, conn, dead, self.now()))

    def forget_dead(self, keep: float) -> int:
        """Delete registrations dead for longer than ``keep`` seconds that hold no job; how many."""
        return self.transaction(lambda conn: fleet.forget(self.ctx, conn, self.now() - keep))

    def wake_addresses(self) -> dict[str, str]:
        """``{name: host:port}`` of every live executor that a datagram wakes."""
        return self.transaction(lambda conn: fleet.wake_addresses(self.ctx, conn, self.now()), read_only=True)

    # -- cancel and retry -----------------------------------------------------------------------------

    def cancel(self, job_ids: Sequence[int], now: float) -> list[Final]:
        """Cancel the given jobs that have not started, and everything downstream of them."""

        def work(conn: Connection) -> list[Final]:
            finals = dag.cancel(self.ctx, conn, job_ids, now)
            self.ctx.notify(conn, finished=[f.job_id for f in finals])
            return finals

        return self.transaction(work)

    def retry(self, job_ids: Sequence[int], retries: int, now: float) -> tuple[dict[int, str], dict[int, str]]:
        """Put failed or cancelled jobs back to ``ready`` (or ``waiting``), with their dependents (see :func:`dag.revive`)."""
        return self.transaction(lambda conn: dag.revive(self.ctx, conn, job_ids, retries, now))

    def request_stop(self, job_ids: Sequence[int]) -> StopRequest:
        """Cancel the given jobs that have not started, and have the running ones terminated where they run.

        A running job's owner sees the request at its next beat, kills the
        job's process tree and records it ``cancelled`` (an attempt row says
        ``terminated``); its dependents are cancelled with it.
        """
        request, _ = self.transaction(lambda conn: control.request_stop(self.ctx, conn, job_ids, self.now()))
        return request

    # -- reads ----------------------------------------------------------------------------------------

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(ctx, conn, *args)`` in a read-only transaction: one of the store modules' reads."""
        return self.transaction(lambda conn: fn(self.ctx, conn, *args), read_only=True)

    def finals(self, job_ids: Sequence[int]) -> list[Final]:
        """The given jobs that are in a final state, with their result or exception."""
        return self.read(reads.finals, job_ids)

    def results(self, job_ids: Sequence[int]) -> dict[int, bytes]:
        """Result pickles of done jobs (the inputs of a job whose payload refers to them)."""
        return self.read(reads.results, job_ids)

    def upstream_results(self, job_ids: Sequence[int]) -> dict[int, dict[int, bytes]]:
        """For each of ``job_ids``, the results of its done upstream jobs (rows that did not record ``arg_refs``)."""
        return self.read(reads.upstream_results, job_ids)

    def job(self, job_id: int) -> Final | None:
        """One job's state (with its result or exception if final), or None if there is no such job."""
        return self.read(reads.job, job_id)

    def job_id_for_key(self, key: str) -> int | None:
        """The id of the job with ``key``, or None."""
        return self.read(reads.job_id_for_key, key)

    def count_states(self) -> dict[str, int]:
        """Number of jobs per state."""
        return self.read(reads.count_states)

    def unfinished(self) -> list[int]:
        """Ids of every job that is not in a final state, oldest first."""
        return self.read(reads.unfinished)

    def ids_in_state(self, state: str) -> list[int]:
        """Ids of every job in ``state``, oldest first."""
        return self.read(reads.ids_in_state, state)

    def progress(self, job_id: int) -> JobProgress | None:
        """What job ``job_id`` last said about its progress (None: nothing yet, or no such job)."""
        return self.read(control.progress, job_id)

    # -- operators ------------------------------------------------------------------------------------

    @cached_property
    def console(self) -> Console:
        """What operators read and do across the whole database (:class:`~dbexecutor.store.console.Console`)."""
        return Console(self)

    # -- retention ------------------------------------------------------------------------------------

    def purge_batch(self, cutoff: float, limit: int = 500) -> int:
        """Delete up to ``limit`` finished jobs that finished before ``cutoff`` (see :func:`admin.purge_batch`)."""
        return self.transaction(lambda conn: admin.purge_batch(self.ctx, conn, cutoff, limit))

    def purge(self, cutoff: float, batch: int = 500) -> int:
        """:meth:`purge_batch` until nothing more goes, then the stored functions no job names; one transaction per batch. Returns the jobs deleted."""
        total = 0
        while n := self.purge_batch(cutoff, batch):
            total += n
        self.sweep_functions()
        return total

    # -- functions stored by value ----------------------------------------------------------------

    @cached_property
    def functions(self) -> FunctionTable:
        """The program's functions this process stored by value or read (see :mod:`dbexecutor.store.functions`)."""
        return FunctionTable(self)

    def sweep_functions(self) -> int:
        """Delete the stored functions that no job left in the table can name; how many went."""
        return self.transaction(lambda conn: stored_functions.sweep(self.ctx, conn, self.now()))
