"""The catalogue: every statement the store runs, by name, with a line that says what it does.

Statements are built once per store (per table prefix and driver) and run
with bound parameters, all named ``p_*``: building and hashing a statement
costs more Python time than its round trip on a local server. Lists of ids
are one parameter (the driver decides how: an array, a JSON text, an
expanding ``IN``), so no statement's text depends on how many ids it gets.

Where a database can do an operation in fewer statements, the driver has its
own form next to these (``Driver.finish_done``, ``Driver.insert_rows``,
``Driver.insert_job_rows``); ``python -m dbexecutor.store.sql`` prints the
catalogue with each statement's SQL for one database.

The statements live in a module per operation, as the store's own code does:
``meta`` (the schema), ``groups``, ``submit``, ``claim``, ``finish``,
``dag``, ``revive`` (retrying a finished job), ``leases``, ``fleet`` (the
registry of executors), ``reads``, ``admin`` (operators' reads),
``retention`` and ``functions`` (the program's functions stored by value). Each module's class is a part over ``base.StatementsBase``
(the tables, the driver, and what the parts share); :class:`Statements` is
made of all of them, so that a store has one object that names every
statement (``ctx.sql``).
"""

from __future__ import annotations

from functools import cached_property

from .admin import THROUGHPUT_BUCKETS, AdminStatements
from .base import BACK_TO_READY, DEFAULT_SCOPE, Scope
from .claim import ClaimStatements
from .dag import DagStatements
from .finish import FinishStatements
from .fleet import FleetStatements
from .functions import FunctionStatements
from .groups import GroupStatements
from .leases import LeaseStatements
from .meta import MetaStatements
from .reads import ReadStatements
from .retention import RetentionStatements
from .revive import ReviveStatements
from .submit import SubmitStatements

__all__ = ["Statements", "Scope", "DEFAULT_SCOPE", "BACK_TO_READY", "THROUGHPUT_BUCKETS", "catalogue"]


# The order of the bases is the catalogue's (see catalogue()): the schema and the
# groups, then the operations in a job's life, then what operators use.
class Statements(
    MetaStatements,
    GroupStatements,
    SubmitStatements,
    ClaimStatements,
    FinishStatements,
    DagStatements,
    ReviveStatements,
    LeaseStatements,
    FleetStatements,
    ReadStatements,
    AdminStatements,
    RetentionStatements,
    FunctionStatements,
):
    """Every statement of one store, built on first use and kept (``cached_property``).

    Made of one part per operation; each part's module says which operation
    its statements serve.
    """


def catalogue(stmts: Statements) -> list[tuple[str, str]]:
    """``(name, first docstring line)`` of every named statement: part by part, as :class:`Statements` lists them, each in source order."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    # Each part in the order Statements lists it (its MRO), then the base, whose
    # public members are the helpers skipped below.
    for part in Statements.__mro__:
        for name, member in vars(part).items():
            target = member.func if isinstance(member, cached_property) else member
            if name.startswith("_") or not callable(target) or name in ("runnable", "fenced") or name in seen:
                continue
            seen.add(name)
            doc = (target.__doc__ or "").strip().splitlines()
            out.append((name, doc[0] if doc else ""))
    return out
