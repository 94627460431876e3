"""Where a scale-out round's slot time goes, from the attempt rows (a diagnostic, not a benchmark).

::

    python -m benchmarks.slots sqlite --rounds 3 [--trace]

One executor process submits 1,200 jobs of 50 ms through a submit-only
``DBExecutor``; 6 ``dbexecutor worker`` processes x 4 slots run them (the
``scaleout`` scenario's ``many`` round). Each attempt row names the child that
ran it and when, so per round it prints: efficiency (ideal / wall), when each
child started its first job after the first submit, the gaps a child spent
between two jobs, and the slot time lost (slots x wall - the jobs' own run
time); per worker, each child's (first start, jobs, last end). With
``--trace`` the workers run under ``benchmarks.sqltrace`` and the statements
of each round are summed by text (the trace costs time of its own).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import wait
from typing import Any

import psutil
from sqlalchemy import text

from dbexecutor import DBExecutor

from . import jobs, procs, sqltrace
from .scaleout import _max_id, _wait_round, workers
from .scenarios import tables


def _report(eng: Any, prefix: str, after: int, t0: float, wall: float, ideal: float, parent: dict[int, int]) -> None:
    with eng.connect() as conn:
        rows = conn.execute(text(
            f"SELECT a.worker, a.started_at, a.ended_at FROM {prefix}attempts a "
            f"WHERE a.job_id > :a ORDER BY a.started_at"), {"a": after}).all()
    per: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for worker, started, ended in rows:
        per[worker].append((started, ended))
    gaps = [b[0] - a[1] for xs in per.values() for a, b in zip(xs, xs[1:])]
    firsts = [xs[0][0] - t0 for xs in per.values()]
    busy = sum(e - s for xs in per.values() for s, e in xs)
    print(f"  efficiency {ideal / wall:.3f}, wall {wall:.3f} s, {len(per)} children, {len(rows)} attempts")
    print(f"  first job after the first submit: min {min(firsts):.3f} median {statistics.median(firsts):.3f} "
          f"max {max(firsts):.3f} s")
    print(f"  gaps between jobs: sum {sum(gaps):.3f} s, median {statistics.median(gaps) * 1000:.1f} ms, "
          f"p90 {sorted(gaps)[int(0.9 * len(gaps))] * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms")
    print(f"  slot time {len(per) * wall:.2f} s, jobs' run time {busy:.2f} s, lost {len(per) * wall - busy:.2f} s")
    by_worker: dict[int, list[tuple[float, int, float]]] = collections.defaultdict(list)
    for worker, xs in per.items():
        pid = int(worker.rsplit(":", 1)[1])
        by_worker[parent.get(pid, -1)].append((round(xs[0][0] - t0, 3), len(xs), round(xs[-1][1] - t0, 3)))
    for k in sorted(by_worker):
        print(f"    worker {k}: {sorted(by_worker[k])}")


def _statements(trace_dir: str, windows: list[tuple[float, float]]) -> None:
    for r, (a, b) in enumerate(windows):
        stm: dict[str, list[float]] = collections.defaultdict(list)
        for name in sorted(os.listdir(trace_dir)):
            for start, seconds, _thread, label in sqltrace.load(os.path.join(trace_dir, name))["statements"]:
                if a <= start <= b:
                    stm[label[:70]].append(seconds)
        print(f"round {r + 1}: statements, by total time")
        for label, xs in sorted(stm.items(), key=lambda kv: -sum(kv[1]))[:8]:
            xs.sort()
            print(f"  {len(xs):6d} x, {sum(xs):.3f} s, p50 {xs[len(xs) // 2] * 1000:.2f} ms  {label}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", choices=("sqlite", "postgresql", "mariadb"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    count, slots, n, sleep = 6, 4, 1200, 0.05
    ideal = n * sleep / (count * slots)
    trace_dir = tempfile.mkdtemp(prefix="dbexecutor-slots-") if args.trace else None
    windows: list[tuple[float, float]] = []
    with tables(args.database) as (url, prefix):
        eng = procs.engine(url)
        sub = DBExecutor(url, 1, prefix=prefix, run_jobs=False)
        try:
            with workers(url, prefix, count, slots, trace_dir) as started:
                wait([sub.submit(jobs.sleep, sleep) for _ in range(2 * count * slots)], 120)  # every child started
                parent = {c.pid: i for i, w in enumerate(started) for c in psutil.Process(w.pid).children(recursive=True)}
                for r in range(args.rounds):
                    after = _max_id(eng, prefix)
                    t0 = time.time()
                    futures = [sub.submit(jobs.sleep, sleep) for _ in range(n)]
                    got = _wait_round(eng, prefix, after, n, 120)
                    windows.append((t0, got["last_done"]))
                    print(f"{args.database} round {r + 1}:")
                    _report(eng, prefix, after, t0, got["last_done"] - t0, ideal, parent)
                    wait(futures, 60)
        finally:
            sub.shutdown(wait=False, cancel_futures=True)
            eng.dispose()
    if trace_dir is not None:
        _statements(trace_dir, windows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
