"""The targets of several full runs side by side: ``python -m benchmarks.targets RUN.json [RUN.json ...]``.

One line per target (a metric that has one), one column per database; each
cell holds every run's figure, in the order given, and the last run's
verdict. Ratios to a reference are shown as its percentage for rates
(higher is better) and as a multiple for times (lower is better); other
targets in the metric's own unit. Prints Markdown, for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.run import fmt

DATABASES = ["sqlite", "postgresql", "mariadb"]


def figure(row: dict[str, Any]) -> str:
    """What a target is judged on: the ratio where the target is one, else the measured value."""
    if row["target"].startswith("ratio"):
        if row["ratio"] is None:
            return "—"
        return f"{row['ratio']:.0%}" if row["unit"] == "/s" else f"{row['ratio']:.2f}x"
    return fmt(row["dbexecutor"], row["unit"])


def targets_table(runs: list[dict[str, Any]]) -> str:
    """The Markdown table of every target of ``runs`` (the results of ``python -m benchmarks``, oldest first)."""
    keys: dict[tuple[str, str, str], None] = {}
    cells: dict[tuple[str, str, str], dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        for row in run["results"]:
            if not row.get("target"):
                continue
            key = (row["scenario"], row["metric"], row["target"])
            keys.setdefault(key)
            cells.setdefault(key, {}).setdefault(row["database"], []).append(row)
    lines = ["| target | " + " | ".join({"sqlite": "SQLite", "postgresql": "PostgreSQL", "mariadb": "MariaDB"}[d]
                                         for d in DATABASES) + " |",
             "|---|" + "---|" * len(DATABASES)]
    for key in keys:
        scenario, metric, target = key
        out = []
        for db in DATABASES:
            got = cells[key].get(db, [])
            if not got:
                out.append("—")
                continue
            last = got[-1]["passed"]
            verdict = "" if last is None else (" ✓" if last else " **✗**")
            out.append(" / ".join(figure(r) for r in got) + verdict)
        lines.append(f"| {scenario}: {metric}: {target} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.targets", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by python -m benchmarks, oldest first")
    args = parser.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in args.runs]
    for path, run in zip(args.runs, runs):
        m = run.get("machine", {})
        print(f"- {path.name}: {m.get('date', '?')}, dbexecutor {m.get('dbexecutor_commit', '?')}")
    print()
    print(targets_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
