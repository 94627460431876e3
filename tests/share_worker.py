"""A second executor process for test_sharing.py.

Usage: ``python share_worker.py URL PREFIX MAX_WORKERS COUNT [DEADLINE_SECONDS]``

Runs a ``DBExecutor`` on the given tables until the jobs table holds at least
COUNT rows and none of them is unfinished, then shuts down and prints ``DONE``.
Exits with status 2 if that does not happen within the deadline.
"""

from __future__ import annotations

import os
import sys
import time

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str]) -> int:
    url, prefix, max_workers, count = argv[1], argv[2], int(argv[3]), int(argv[4])
    deadline = time.monotonic() + (float(argv[5]) if len(argv) > 5 else 120.0)

    # The children unpickle ``jobs.record`` and friends by name.
    if TESTS_DIR not in sys.path:
        sys.path.insert(0, TESTS_DIR)

    from dbexecutor import DBExecutor
    from dbexecutor.schema import FINAL_STATES
    from dbexecutor.store import Store

    # Serves every queue: like a worker, it runs what the test process submits.
    ex = DBExecutor(url, max_workers, prefix=prefix, poll_interval=0.05, queues="*")
    print("STARTED", os.getpid(), flush=True)
    store = Store(url, prefix)
    status = 2
    try:
        while time.monotonic() < deadline:
            counts = store.count_states()
            total = sum(counts.values())
            unfinished = sum(n for state, n in counts.items() if state not in FINAL_STATES)
            if total >= count and unfinished == 0:
                status = 0
                break
            time.sleep(0.1)
    finally:
        store.close()
        ex.shutdown(wait=True)
    print("DONE" if status == 0 else "DEADLINE", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
