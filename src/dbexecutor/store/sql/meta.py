"""Statements of the schema: the version recorded in the ``meta`` table, and a write that takes the write lock.

``store.migrations`` reads and records the version. On a single-writer
database (SQLite) the store runs ``take_write_lock`` first in a submit, so
that what it reads next cannot change before it commits.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, Update, literal_column, select, update

from .base import StatementsBase, _p

__all__ = ["MetaStatements"]


class MetaStatements(StatementsBase):
    """The statements on the ``meta`` table: the schema version and the write lock."""

    @cached_property
    def schema_version(self) -> Select[Any]:
        """The recorded schema version (None on a database without one)."""
        meta = self.tables.meta
        return select(meta.c.value).where(meta.c.name == "schema_version")

    @cached_property
    def take_write_lock(self) -> Update:
        """A write that changes no row: on a single-writer database (SQLite) the transaction it runs in holds the write lock from then on."""
        meta = self.tables.meta
        return update(meta).where(literal_column("0") == literal_column("1")).values(value=meta.c.value)

    @cached_property
    def set_schema_version(self) -> Update:
        """Record schema version ``p_value``."""
        meta = self.tables.meta
        return update(meta).where(meta.c.name == "schema_version").values(value=_p("value"))
