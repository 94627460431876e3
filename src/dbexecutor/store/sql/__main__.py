"""``python -m dbexecutor.store.sql [URL]``: the catalogue, with each statement's SQL for the database of ``URL``."""

from __future__ import annotations

from . import Statements, catalogue


def _main() -> None:  # pragma: no cover - a reading aid
    import sys

    from ...dialects import resolve

    url = sys.argv[1] if len(sys.argv) > 1 else "sqlite:///catalogue.db"
    driver = resolve(url)
    stmts = Statements(driver.make_tables(""), driver)
    from sqlalchemy import create_engine

    dialect = create_engine(driver.url).dialect
    for name, line in catalogue(stmts):
        member = getattr(stmts, name)
        stmt = member() if callable(member) and not hasattr(member, "compile") else member
        print(f"-- {name}: {line}\n{stmt.compile(dialect=dialect)};\n")


if __name__ == "__main__":  # pragma: no cover
    _main()
