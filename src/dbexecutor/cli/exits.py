"""Exit statuses, what each means, and the exceptions that end a command with one."""

from __future__ import annotations

EXIT_OK = 0
EXIT_NOTHING = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_SCHEMA = 4
EXIT_UNHEALTHY = 5

#: What each exit status means, for scripts.
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_NOTHING: "nothing found or nothing done (no such job, not in a state that allows it)",
    EXIT_USAGE: "usage error: bad arguments, malformed URL, unsupported database or driver",
    EXIT_DATABASE: "the database is unreachable or an SQL statement failed",
    EXIT_SCHEMA: "no dbexecutor tables with this prefix (run `dbexecutor migrate`), or tables of another version",
    EXIT_UNHEALTHY: "health: work is ready to run but no live worker runs jobs",
}


class UsageError(Exception):
    """A problem with the command line itself (exit status 2)."""


class _Failure(Exception):
    """End the command with ``status`` after printing ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
