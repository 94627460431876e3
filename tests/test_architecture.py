"""The rules of the layout, checked: where SQL and dialect knowledge may live, and the statement catalogue."""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Any

import pytest
from sqlalchemy import create_engine

import dbexecutor
from dbexecutor.store.sql import Statements, catalogue

SRC = pathlib.Path(dbexecutor.__file__).parent
DIALECT_NAMES = re.compile(r"\b(sqlite|postgres(?:ql)?|mysql|mariadb|psycopg|pymysql)\b", re.IGNORECASE)


def _compared_strings(path: pathlib.Path) -> list[tuple[int, str]]:
    """String constants that code compares with (``==``, ``in`` ...): what a branch on a name would look like."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for const in ast.walk(side):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        found.append((node.lineno, const.value))
        elif isinstance(node, ast.Attribute) and node.attr in ("is_mariadb", "server_version_info"):
            found.append((node.lineno, node.attr))
    return found


def test_no_dialect_names_or_dialect_checks_outside_the_dialect_package():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "dialects":
            continue
        for line, text in _compared_strings(path):
            if DIALECT_NAMES.search(text) or text in ("is_mariadb", "server_version_info"):
                offenders.append(f"{rel}:{line}: {text!r}")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.dialect\.(name|driver|is_mariadb|server_version)|engine\.dialect\b", line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_sql_lives_in_the_store_and_the_dialects():
    # Modules outside store/ and dialects/ (and the schema) build no statements.
    builders = re.compile(r"(?<![.\w])(select|insert|update|delete|text)\(|exec_driver_sql|\.execute\(")
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in ("store", "dialects") or rel.name == "schema.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if builders.search(code) and "import" not in code:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _sql(stmts: Statements, name: str, dialect: Any) -> str:
    """Catalogue entry ``name`` compiled for ``dialect`` (a scoped one in its default variant)."""
    member = getattr(stmts, name)
    stmt = member() if callable(member) and not hasattr(member, "compile") else member
    return str(stmt.compile(dialect=dialect))


def test_every_statement_in_the_catalogue_is_named_described_and_compiles(db):
    store = db.store()
    try:
        stmts: Statements = store.ctx.sql
        entries = catalogue(stmts)
        assert len(entries) > 50
        dialect = create_engine(store.url).dialect
        for name, line in entries:
            assert line and 15 < len(line) < 200, f"{name}: its docstring's first line says what it does"
            assert _sql(stmts, name, dialect), name
    finally:
        store.close()


#: Operators' statements whose state is the caller's choice (a retry's old state, a listing's).
_STATE_CHOSEN_BY_CALLER = {"revive", "ids_in_state"}


def test_no_statement_compares_a_jobs_state_with_a_bound_parameter(db):
    # SQLite prepares a statement again at every run when a condition on state, a
    # column of the partial indexes' predicates, has a parameter (to see whether
    # an index fits the value): a chain's count-down cost 190 us a run, 60 us with
    # the state written in. Written in, the plan is the same on every database.
    store = db.store()
    try:
        stmts: Statements = store.ctx.sql
        dialect = create_engine(store.url).dialect
        bound = re.compile(r"\bstate\s*(=|!=|<>|IN)\s*\(?\s*(\?|%\(|%s|:|\$|\[POSTCOMPILE)")
        offenders = []
        for name, _ in catalogue(stmts):
            if name in _STATE_CHOSEN_BY_CALLER:
                continue
            sql = _sql(stmts, name, dialect)
            where = sql.split("WHERE", 1)[1] if "WHERE" in sql else ""
            if bound.search(where):
                offenders.append(f"{name}: {where[:160]}")
        assert not offenders, "\n".join(offenders)
        # The rule is not vacuous: the count-down does compare the state, written in.
        assert re.search(r"state (=|IS NOT DISTINCT FROM) 'waiting'", str(stmts.count_down_finished.compile(dialect=dialect)))
    finally:
        store.close()


def test_the_claims_statements_bind_their_lists_as_one_parameter_where_the_database_allows(db):
    # An expanding IN list is written into the statement's text by SQLAlchemy at
    # every execution (on SQLite a pick cost 78-90 us against 50-55 with the
    # queues as one JSON parameter). Every claim and every leased insert names
    # the executor's queues (and the functions it skips): on SQLite and
    # PostgreSQL they go as one parameter. MySQL has neither json_each in the
    # same form nor arrays, and keeps the expanding list.
    if db.kind == "mariadb":
        pytest.skip("MySQL binds lists by expanding them")
    store = db.store()
    try:
        stmts: Statements = store.ctx.sql
        dialect = create_engine(store.url).dialect
        scoped = ["runnable_groups", "runnable_groups_locked", "pick", "pick_alone", "lease_picked",
                  "lease_picked_alone", "free_for", "insert_leased"]
        for name in scoped:
            stmt = getattr(stmts, name)((False, True))  # a list of queues, and functions skipped
            sql = str(stmt.compile(dialect=dialect))
            assert "POSTCOMPILE" not in sql, f"{name}: {sql[:300]}"
    finally:
        store.close()


def test_the_ui_and_the_command_line_talk_to_the_stores_front_only():
    # The store's modules behind its front (admin, sql, fleet...) are its own business, and
    # nothing here builds a statement (SQLAlchemy's errors and URLs are fine).
    inner = re.compile(r"from \.+store\.\w+ import|from dbexecutor\.store\.\w+ import|import dbexecutor\.store\.")
    offenders = []
    for path in [*sorted((SRC / "cli").glob("*.py")), SRC / "worker.py", SRC / "metrics.py", *sorted((SRC / "ui").glob("*.py"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if inner.search(line) or re.search(r"^\s*from sqlalchemy(\.sql[\w.]*)? import", line):
                offenders.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
