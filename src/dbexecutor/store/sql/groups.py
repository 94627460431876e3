"""Statements of the groups: made on first submit, their weights and concurrency limits, read back.

``store.submit`` makes the groups its jobs name; ``store.admin`` sets
weights and limits and lists the groups.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from sqlalchemy import Select, Update, select, update

from .base import StatementsBase, _p

__all__ = ["GroupStatements"]


class GroupStatements(StatementsBase):
    """The statements on the groups table: making groups, weights and limits, reading them."""

    @cached_property
    def ensure_group(self) -> Any:
        """Create group ``p_name`` with weight ``p_weight`` unless it exists."""
        g = self.tables.groups
        return self.driver.insert_ignore(g).values(name=_p("name", g.c.name), weight=_p("weight", g.c.weight))

    @cached_property
    def set_group_weight(self) -> Update:
        """Give group ``p_name`` the weight ``p_weight`` (no write when it has it already)."""
        g = self.tables.groups
        return update(g).where(g.c.name == _p("name"), g.c.weight != _p("weight")).values(weight=_p("weight"))

    @cached_property
    def set_group_limit(self) -> Update:
        """Set group ``p_name``'s concurrency limit to ``p_limit`` (NULL: none; 0 pauses it)."""
        g = self.tables.groups
        return update(g).where(g.c.name == _p("name")).values(max_running=_p("limit", g.c.max_running))

    @cached_property
    def group(self) -> Select[Any]:
        """Group ``p_name``: weight, limit, virtual time."""
        g = self.tables.groups
        return select(g).where(g.c.name == _p("name"))

    @cached_property
    def groups(self) -> Select[Any]:
        """Every group, by name."""
        g = self.tables.groups
        return select(g).order_by(g.c.name)
