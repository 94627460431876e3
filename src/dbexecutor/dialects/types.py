"""Column types and table options that differ per database, for the schema's table definitions.

SQLAlchemy renders each variant only for its own dialect, so one table
definition serves every database; this module is where those per-database
spellings live (``schema`` only uses the names below).

Nothing here imports a dialect's module: a keyword argument such as
``mysql_engine`` makes SQLAlchemy import that dialect to check it, so the
tables of one database are built with that database's options only
(:func:`options`, :func:`partial`); a PostgreSQL process then never loads
the MySQL and SQLite dialects (about 17 ms of its start).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Integer, LargeBinary, Text

__all__ = ["Id", "Blob", "LongText", "TABLE_OPTIONS", "JOBS_OPTIONS", "options", "partial"]

_MYSQL = ("mysql", "mariadb")

#: Primary and foreign keys: BIGINT everywhere but SQLite, whose autoincrement needs INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
#: Pickles: MySQL's BLOB stops at 64 KiB, and payloads and results can be much larger. A
#: length makes MySQL pick the smallest type that holds it: LONGBLOB (4 GiB).
Blob = LargeBinary().with_variant(LargeBinary(length=2**32 - 1), *_MYSQL)
#: Long text (errors, tracebacks, id lists): MySQL's TEXT stops at 64 KiB too. The length is in
#: characters of four bytes (utf8mb4): MEDIUMTEXT (16 MiB).
LongText = Text().with_variant(Text(length=(2**24 - 1) // 4), *_MYSQL)

#: Every table: InnoDB (row locks, SKIP LOCKED) and full UTF-8 on MySQL/MariaDB.
TABLE_OPTIONS: dict[str, Any] = {
    "mysql_engine": "InnoDB",
    "mysql_charset": "utf8mb4",
    "mariadb_engine": "InnoDB",
    "mariadb_charset": "utf8mb4",
}
#: The jobs table also: SQLite would otherwise hand out the id of a purged last
#: row again, and an old future (or a command-line user) would name another job.
JOBS_OPTIONS: dict[str, Any] = {**TABLE_OPTIONS, "sqlite_autoincrement": True}


def options(given: dict[str, Any], dialect: str | None) -> dict[str, Any]:
    """The keyword arguments of ``given`` that ``dialect`` reads (None: all of them, for every database)."""
    if dialect is None:
        return given
    mine = _MYSQL if dialect in _MYSQL else (dialect,)
    return {k: v for k, v in given.items() if k.partition("_")[0] in mine}


def partial(where: Any, dialect: str | None = None) -> dict[str, Any]:
    """Index keyword arguments that make it partial (``WHERE where``) on the databases that have partial indexes."""
    return options({"postgresql_where": where, "sqlite_where": where}, dialect)
