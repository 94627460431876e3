"""Statements of the ``functions`` table: the program's functions pickled by value, stored once and named by digest.

``store.functions`` writes a pickle the first time a payload names it and
renews its ``used_at`` while payloads keep naming it; a parent reads the
pickles the jobs it dispatches name; retention deletes those no job left in
the table can name.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, delete, func, insert, select, update

from .base import StatementsBase, _p

__all__ = ["FunctionStatements"]


class FunctionStatements(StatementsBase):
    """The statements of the stored by-value functions."""

    @cached_property
    def function_data(self) -> Select[Any]:
        """The pickle stored under digest ``p_digest`` (no row: none stored)."""
        f = self.tables.functions
        return select(f.c.data).where(f.c.digest == _p("digest"))

    @cached_property
    def touch_function(self) -> Any:
        """Say that payloads name the pickle ``p_digest`` as of ``p_now`` (no row: not stored yet)."""
        f = self.tables.functions
        return update(f).where(f.c.digest == _p("digest")).values(used_at=_p("now"))

    @cached_property
    def insert_function(self) -> Any:
        """Store the pickle ``p_data`` under its digest ``p_digest``, named as of ``p_now``."""
        f = self.tables.functions
        return insert(f).values(digest=_p("digest"), data=_p("data", f.c.data), created_at=_p("now"), used_at=_p("now"))

    @cached_property
    def oldest_job(self) -> Select[Any]:
        """When the oldest job in the table was submitted (NULL: no job)."""
        j = self.tables.jobs
        return select(func.min(j.c.created_at))

    @cached_property
    def delete_unnamed_functions(self) -> Any:
        """Delete the pickles last named before ``p_bound``."""
        f = self.tables.functions
        return delete(f).where(f.c.used_at < _p("bound"))
