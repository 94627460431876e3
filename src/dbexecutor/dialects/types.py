"""Column types and table options that differ per database, for the schema's table definitions.

SQLAlchemy renders each variant only for its own dialect, so one table
definition serves every database; this module is where those per-database
spellings live (``schema`` only uses the names below).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Integer, LargeBinary, Text
from sqlalchemy.dialects import mysql

__all__ = ["Id", "Blob", "LongText", "TABLE_OPTIONS", "JOBS_OPTIONS", "partial"]

#: Primary and foreign keys: BIGINT everywhere but SQLite, whose autoincrement needs INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
#: Pickles: MySQL's BLOB stops at 64 KiB, and payloads and results can be much larger.
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: Long text (errors, tracebacks, id lists): MySQL's TEXT stops at 64 KiB too.
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")

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


def partial(where: Any) -> dict[str, Any]:
    """Index keyword arguments that make it partial (``WHERE where``) on the databases that have partial indexes."""
    return {"postgresql_where": where, "sqlite_where": where}
