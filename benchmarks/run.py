"""Benchmarks: dbexecutor against ProcessPoolExecutor on the same workload, same run.

    python benchmarks/run.py                      # every database, default sizes
    python benchmarks/run.py --databases sqlite --jobs 2000 --json out.json

Prints a table and writes JSON. Ratios (dbexecutor / ProcessPoolExecutor)
are what to compare across machines; absolute numbers depend on the box.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # so children import jobs by name

import jobs  # noqa: E402

from dbexecutor import DBExecutor  # noqa: E402
from dbexecutor.store import Store  # noqa: E402

URLS = {
    "sqlite": None,  # a fresh file per run
    "postgresql": os.environ.get("DBEXECUTOR_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("DBEXECUTOR_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}


def throughput(ex: Executor, n: int) -> float:
    """Jobs per second: ``n`` trivial jobs submitted one by one, until every result is back."""
    ex.submit(jobs.noop, 0).result()  # warm: children started, tables created
    start = time.perf_counter()
    futures = [ex.submit(jobs.noop, i) for i in range(n)]
    for f in futures:
        f.result()
    return n / (time.perf_counter() - start)


def map_rate(ex: Executor, n: int, chunksize: int) -> float:
    """Items per second through ``map`` with ``chunksize``."""
    ex.submit(jobs.noop, 0).result()
    start = time.perf_counter()
    assert sum(ex.map(jobs.noop, range(n), chunksize=chunksize)) == n * (n - 1) // 2
    return n / (time.perf_counter() - start)


SCENARIOS: dict[str, Callable[[Executor, int], float]] = {
    "throughput": throughput,
    "map_chunk1": lambda ex, n: map_rate(ex, n, 1),
    "map_chunk64": lambda ex, n: map_rate(ex, n, 64),
}


def with_dbexecutor(kind: str, workers: int, fn: Callable[[Executor], float]) -> float:
    prefix = f"bench{uuid.uuid4().hex[:8]}_"
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[kind] or f"sqlite:///{tmp}/bench.db"
        ex = DBExecutor(url, workers, prefix=prefix)
        try:
            with ex:
                return fn(ex)
        finally:
            store = Store(url, prefix, create=False)
            store.drop_schema()
            store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--databases", default="sqlite,postgresql,mariadb")
    parser.add_argument("--scenarios", default="throughput")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "latest.json"))
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for scenario in args.scenarios.split(","):
        run = SCENARIOS[scenario]
        for kind in args.databases.split(","):
            # ProcessPoolExecutor on the same workload right before, so the ratio holds on a noisy box.
            with ProcessPoolExecutor(args.workers) as ppe:
                base = run(ppe, args.jobs)
            ours = with_dbexecutor(kind, args.workers, lambda ex: run(ex, args.jobs))
            rows.append({"scenario": scenario, "database": kind, "jobs": args.jobs, "workers": args.workers,
                         "dbexecutor_per_s": round(ours, 1), "processpool_per_s": round(base, 1),
                         "ratio": round(ours / base, 4)})
            r = rows[-1]
            print(f"{scenario:<12} {kind:<11} {r['dbexecutor_per_s']:>10.0f}/s  PPE {r['processpool_per_s']:>8.0f}/s  "
                  f"ratio {r['ratio']:.1%}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                               "platform": platform.platform()}, "results": rows}, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
