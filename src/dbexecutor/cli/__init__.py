"""The ``dbexecutor`` command line: inspect, repair and serve a job database.

::

    dbexecutor status  [URL] [--watch]          counts per state and group, running jobs, throughput, ETA
    dbexecutor list    [URL] [--state S] ...    jobs matching filters
    dbexecutor show    [URL] ID                 one job: call, edges, attempts, progress, traceback
    dbexecutor retry   [URL] ID... | filters    failed/cancelled jobs (and their dependents) back to ready
    dbexecutor cancel  [URL] ID... | filters    jobs that have not started (and their dependents);
                                                with --running, running ones too, wherever they run
    dbexecutor group   [URL] [--name G] ...     list groups, or show and change one
    dbexecutor workers [URL]                    registered executors and workers, alive or dead
    dbexecutor health  [URL]                    reachable, schema current, a live worker for ready work
    dbexecutor purge   [URL] --older-than 7d    delete finished jobs
    dbexecutor migrate [URL]                    create or upgrade the tables
    dbexecutor worker  [URL] --max-workers N    run jobs until SIGTERM/SIGINT
    dbexecutor ui      [URL]                    the web UI (the ``ui`` extra)

The URL comes from the positional argument, ``--url`` or ``$DBEXECUTOR_URL``;
the signing secret from ``$DBEXECUTOR_SECRET`` or ``--secret-file`` (never a
command-line value: other users can read a process's arguments). Nothing
here unpickles a stored blob: ``show`` reads payloads and tracebacks with
``pickletools``, which parses a pickle without running it. Every ``--json``
output uses the same field names (``id``, ``state``, ``group``,
``function``, ``key``, ``worker``...; see :mod:`dbexecutor.readmodels`). Ages
and times are the database server's.

Exit codes (see :data:`EXIT_CODES`): 0 ok, 1 nothing found or nothing done,
2 usage error (bad arguments or URL), 3 database unreachable or failing,
4 no dbexecutor tables here (run ``migrate``) or tables of another version,
5 (``health``) work is ready but no live worker runs jobs.

Where each part lives in this package::

    exits.py    exit statuses (EXIT_CODES) and the exceptions that end a command with one
    format.py   tables, ages, times, bars, percentages, JSON lines
    status.py   status
    jobs.py     list, show (and show_data, for the UI), retry, cancel, purge
    groups.py   group
    fleet.py    migrate, workers, health
    parser.py   the arguments of every command; URL, prefix, job ids and secret
    run.py      main: parse, open the store, dispatch, errors to exit statuses

``worker`` and ``ui`` live in :mod:`dbexecutor.worker` and :mod:`dbexecutor.ui`,
imported only by those commands.
"""

from __future__ import annotations

# What other modules, tests and installed scripts import from ``dbexecutor.cli``.
from ..blobs import pickle_summary, stored_traceback
from ..durations import parse_duration
from .exits import EXIT_CODES
from .jobs import show_data
from .run import main, main_exit as main_exit  # not in __all__, as before: scripts installed by earlier builds call it

__all__ = ["main", "parse_duration", "pickle_summary", "stored_traceback", "show_data", "EXIT_CODES"]
