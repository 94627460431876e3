"""A process for test_faults.py to kill: runs a DBExecutor workload until it ends or is killed.

Usage: ``python fault_driver.py MODE URL OPTIONS_JSON [ARGS...]`` where MODE is

- ``dag SEED N``: submit the seeded DAG of N keyed jobs (see :func:`build_dag`),
  wait for all of them and check every result; exit 0 when all are right;
- ``sleeper PID_PATH``: submit one job that starts a grandchild and sleeps 60 s,
  and wait for it (the test kills this process);
- ``submitted N FLUSH``: submit N jobs (``FLUSH`` 1: then call ``flush()``),
  print ``submitted``, and wait to be killed;
- ``keys RECORD_PATH CRASH_AFTER``: submit 20 keyed jobs that append to
  RECORD_PATH; with CRASH_AFTER > 0, ``os._exit`` once that many are done,
  else wait for all of them and exit 0;
- ``hold N GATE STARTED_DIR``: run N jobs at once, each noting its start in
  STARTED_DIR and waiting for the file GATE; exit 0 once all are done (the
  test counts this process tree's database connections meanwhile);
- ``record RECORD_PATH SECONDS``: submit one job that appends a line to
  RECORD_PATH and, on its first run only, sleeps SECONDS; wait for it (the
  test freezes or kills this process, and another runs the job again).

The module is imported by the tests too (for :func:`build_dag` and
:func:`expected_values`), and by the forkserver as ``__mp_main__``: the work
runs only under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # so that the children can import ``jobs`` by name
    sys.path.insert(0, HERE)

DAG_PAUSE = 0.02  # seconds each DAG node sleeps (long enough that a kill lands mid-run)
KEYS = 20


def build_dag(seed: int, n: int) -> list[list[int]]:
    """The dependencies of each node 0..n-1: up to 3 distinct earlier nodes, from ``seed``."""
    rng = random.Random(seed)
    dag: list[list[int]] = []
    for i in range(n):
        lo = max(0, i - 30)
        k = rng.randint(0, min(3, i - lo))
        dag.append(sorted(rng.sample(range(lo, i), k)))
    return dag


def expected_values(seed: int, n: int) -> list[int]:
    """What each node's job returns, computed in plain Python."""
    values: list[int] = []
    for i, deps in enumerate(build_dag(seed, n)):
        values.append((i + sum(values[d] for d in deps)) % 1_000_003)
    return values


def _dag(url: str, options: dict, seed: int, n: int) -> int:
    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    futs = []
    for i, deps in enumerate(build_dag(seed, n)):
        futs.append(ex.options(key=f"n{i}").submit(jobs.fault_dag_node, i, DAG_PAUSE, *[futs[d] for d in deps]))
    print(f"submitted {len(futs)}", flush=True)
    got = [f.result(timeout=240) for f in futs]
    ex.shutdown()
    want = expected_values(seed, n)
    bad = [i for i in range(n) if got[i] != want[i]]
    if bad:
        print(f"wrong results for nodes {bad[:20]}", flush=True)
        return 1
    print("all results right", flush=True)
    return 0


def _sleeper(url: str, options: dict, pid_path: str) -> int:
    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    fut = ex.submit(jobs.fault_spawn_and_hang, pid_path, 1, 60.0)
    fut.result(timeout=120)
    return 0


def _keys(url: str, options: dict, record_path: str, crash_after: int) -> int:
    import concurrent.futures as cf

    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    futs = [
        ex.options(key=f"k{i}").submit(jobs.fault_record_then_sleep, record_path, f"k{i}", 0.15) for i in range(KEYS)
    ]
    done = 0
    for fut in cf.as_completed(futs, timeout=120):
        assert fut.result() in {f"k{i}" for i in range(KEYS)}
        done += 1
        if crash_after and done >= crash_after:
            print(f"crashing after {done} done", flush=True)
            os._exit(17)
    ex.shutdown()
    print(f"all {done} done", flush=True)
    return 0


def _submitted(url: str, options: dict, n: int, flush: bool) -> int:
    import time

    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    for i in range(n):
        ex.submit(jobs.identity, i)
    if flush:
        ex.flush()
    print("submitted", flush=True)
    time.sleep(600)  # the test kills this process
    return 0


def _hold(url: str, options: dict, n: int, gate: str, started_dir: str) -> int:
    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    futs = [ex.submit(jobs.hold_until, gate, started_dir, i) for i in range(n)]
    got = [f.result(timeout=240) for f in futs]
    ex.shutdown()
    print(f"held {got}", flush=True)
    return 0 if got == list(range(n)) else 1


def _record(url: str, options: dict, record_path: str, seconds: float) -> int:
    import jobs
    from dbexecutor import DBExecutor

    ex = DBExecutor(url, **options)
    fut = ex.submit(jobs.record_then_sleep_once, record_path, seconds)
    print(f"submitted {fut.job_id}", flush=True)
    fut.result(timeout=seconds + 120)
    return 0


def main(argv: list[str]) -> int:
    mode, url, options = argv[0], argv[1], json.loads(argv[2])
    rest = argv[3:]
    if mode == "dag":
        return _dag(url, options, int(rest[0]), int(rest[1]))
    if mode == "sleeper":
        return _sleeper(url, options, rest[0])
    if mode == "submitted":
        return _submitted(url, options, int(rest[0]), rest[1] == "1")
    if mode == "keys":
        return _keys(url, options, rest[0], int(rest[1]))
    if mode == "record":
        return _record(url, options, rest[0], float(rest[1]))
    if mode == "hold":
        return _hold(url, options, int(rest[0]), rest[1], rest[2])
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
