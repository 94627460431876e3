"""A small DAG on the embedded SQLite default: load two files, clean them, report.

Run it twice: the second run finds the jobs by their keys and prints the
stored results without running anything again.
"""

from __future__ import annotations

import os
import time

from dbexecutor import DBExecutor


def load(name: str) -> list[int]:
    time.sleep(0.2)  # pretend to read a file
    return [len(name) * i for i in range(5)]


def clean(rows: list[int]) -> list[int]:
    return [r for r in rows if r % 2 == 0]


def report(a: list[int], b: list[int]) -> str:
    return f"{len(a) + len(b)} rows, total {sum(a) + sum(b)} (report written by pid {os.getpid()})"


if __name__ == "__main__":
    with DBExecutor("sqlite:///quickstart.db", max_workers=2) as ex:
        keyed = ex.options
        a = keyed(key="load:a").submit(load, "a.csv")
        b = keyed(key="load:b").submit(load, "bb.csv")
        ca = keyed(key="clean:a").submit(clean, a)  # a future as an argument: dependency + its result
        cb = keyed(key="clean:b").submit(clean, b)
        out = keyed(key="report").submit(report, ca, cb)
        squares = list(ex.map(pow, range(8), [2] * 8))  # map works as with ProcessPoolExecutor
        print("loaded:  ", a.result(), b.result())
        print("cleaned: ", ca.result(), cb.result())
        print("report:  ", out.result())
        print("squares: ", squares)
        print(f"jobs live in quickstart.db (job ids {a.job_id}..{out.job_id})")
