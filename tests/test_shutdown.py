"""Shutdown, cancel, garbage collection and interpreter exit."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest

import jobs
from dbexecutor import DBExecutor
from seams import scheduler_of

T = 60
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def _wait_running(futs, timeout: float = 30) -> None:
    """Wait until each future's job has been handed to a child."""
    deadline = time.monotonic() + timeout
    while not all(f.running() or f.done() for f in futs):
        assert time.monotonic() < deadline, "jobs did not start"
        time.sleep(0.02)


# -- shutdown -------------------------------------------------------------------------


def test_context_manager_waits_for_jobs(db):
    with db.executor(2) as ex:
        futs = [ex.submit(jobs.sleep, 0.2, i) for i in range(5)]
    assert all(f.done() for f in futs)
    assert [f.result(timeout=0) for f in futs] == list(range(5))
    assert set(db.states(futs).values()) == {"done"}


def test_shutdown_wait_true_returns_after_all_results(db):
    ex = db.executor(2)
    futs = [ex.submit(jobs.sleep, 0.2, i) for i in range(5)] + [ex.submit(jobs.fail, "late")]
    ex.shutdown(wait=True)
    assert all(f.done() for f in futs)
    assert [f.result(timeout=0) for f in futs[:-1]] == list(range(5))
    assert isinstance(futs[-1].exception(timeout=0), jobs.CustomError)
    assert not scheduler_of(ex).is_alive()


def test_shutdown_wait_false_returns_at_once_and_jobs_complete(db):
    ex = db.executor(2)
    futs = [ex.submit(jobs.sleep, 0.5, i) for i in range(4)]
    start = time.monotonic()
    ex.shutdown(wait=False)
    assert time.monotonic() - start < 0.4
    assert not all(f.done() for f in futs)
    assert [f.result(timeout=T) for f in futs] == list(range(4))
    assert set(db.states(futs).values()) == {"done"}


def test_shutdown_cancel_futures(db, tmp_path):
    ex = db.executor(2)
    flag = str(tmp_path / "release")
    try:
        busy = [ex.submit(jobs.wait_for_file, flag, i, 30) for i in range(2)]
        _wait_running(busy)
        held = [ex.submit(jobs.identity, i) for i in range(5)]
        held.append(ex.submit(jobs.add, busy[0], 1))  # a waiting job too
        start = time.monotonic()
        ex.shutdown(wait=False, cancel_futures=True)
        assert time.monotonic() - start < 2
    finally:
        open(flag, "w").close()
    assert [f.result(timeout=T) for f in busy] == [0, 1]
    for f in held:
        assert f.cancelled(), f
        with pytest.raises(cf.CancelledError):
            f.result(timeout=0)
    ex.shutdown(wait=True)
    states = db.states(busy + held)
    assert [states[f.job_id] for f in busy] == ["done", "done"]
    assert [states[f.job_id] for f in held] == ["cancelled"] * len(held)


@pytest.mark.parametrize("wait", [True, False])
def test_submit_after_shutdown_raises(db, wait):
    ex = db.executor()
    assert ex.submit(jobs.add, 1, 1).result(timeout=T) == 2
    ex.shutdown(wait=wait)
    with pytest.raises(RuntimeError):
        ex.submit(jobs.add, 1, 2)
    with pytest.raises(RuntimeError):
        ex.map(jobs.square, range(3))
    store = db.store()
    try:
        assert store.count_states() == {"done": 1}
    finally:
        store.close()


# -- JobFuture.cancel ------------------------------------------------------------------------


def test_cancel_not_started_job(db, tmp_path):
    ex = db.executor(1)
    flag = str(tmp_path / "release")
    ran = str(tmp_path / "ran.txt")
    try:
        holder = ex.submit(jobs.wait_for_file, flag, "held", 30)
        _wait_running([holder])
        target = ex.submit(jobs.record, ran, "target")  # ready, but no free worker
        assert target.cancel() is True
        assert target.cancelled() and target.done()
        assert target.cancel() is True  # idempotent
        with pytest.raises(cf.CancelledError):
            target.result(timeout=0)
        assert db.states([target]) == {target.job_id: "cancelled"}
        # Another executor on the same tables with free workers never runs it:
        # were it still ready, ex2 would claim it before its own probe (lower id).
        ex2 = db.executor(1)
        assert ex2.submit(jobs.identity, "probe").result(timeout=T) == "probe"
    finally:
        open(flag, "w").close()
    assert holder.result(timeout=T) == "held"
    assert ex2.submit(jobs.identity, "probe2").result(timeout=T) == "probe2"
    ex.shutdown(wait=True)
    ex2.shutdown(wait=True)
    assert db.states([target]) == {target.job_id: "cancelled"}
    assert not os.path.exists(ran), "the cancelled job ran"


def test_cancel_running_or_finished_job_returns_false(db, tmp_path):
    ex = db.executor(1)
    flag = str(tmp_path / "release")
    try:
        running = ex.submit(jobs.wait_for_file, flag, "held", 30)
        _wait_running([running])
        assert running.cancel() is False
        assert not running.cancelled()
        # A future for the same job in another executor: the database says no too.
        ex2 = db.executor(1)
        remote = ex2.future(running.job_id)
        assert remote.cancel() is False
        assert not remote.cancelled()
    finally:
        open(flag, "w").close()
    assert running.result(timeout=T) == "held"
    assert remote.result(timeout=T) == "held"
    assert running.cancel() is False and not running.cancelled()
    finished = ex.submit(jobs.identity, 3)
    assert finished.result(timeout=T) == 3
    assert finished.cancel() is False and not finished.cancelled()
    states = db.states([running, finished])
    assert set(states.values()) == {"done"}


# -- garbage collection ---------------------------------------------------------------------------


def test_dropping_the_last_reference_shuts_down(db):
    ex = DBExecutor(db.url, 2, **db.options)
    sched = scheduler_of(ex)  # holds no reference to the executor
    store = ex._store
    try:
        assert sched.is_alive()
        assert ex.submit(jobs.add, 1, 2).result(timeout=T) == 3
        pending = ex.submit(jobs.sleep, 0.3, "finished anyway")
        del ex
        gc.collect()
        # As with ProcessPoolExecutor, submitted work still completes...
        assert pending.result(timeout=T) == "finished anyway"
        # ... and then the scheduler thread ends.
        sched.join(10)
        assert not sched.is_alive(), "the scheduler thread outlived its executor"
    finally:
        store.close()


# -- interpreter exit --------------------------------------------------------------------------------


def test_submit_during_interpreter_shutdown_raises(tmp_path):
    script = tmp_path / "atexit_submit.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, sys
            sys.path.insert(0, {TESTS_DIR!r})
            import jobs
            from dbexecutor import DBExecutor

            def late():
                try:
                    ex.submit(jobs.add, 1, 2)
                except BaseException as error:
                    print("RAISED", type(error).__name__, error, flush=True)
                else:
                    print("NO ERROR", flush=True)

            if __name__ == "__main__":
                ex = DBExecutor({f"sqlite:///{tmp_path / 'exit.db'}"!r}, 1, poll_interval=0.05)
                atexit.register(late)
                print("RESULT", ex.submit(jobs.add, 1, 2).result(timeout=60), flush=True)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert "RESULT 3" in proc.stdout, proc.stdout + proc.stderr
    assert "RAISED RuntimeError" in proc.stdout, proc.stdout + proc.stderr
    assert "NO ERROR" not in proc.stdout
    assert proc.returncode == 0, proc.stderr


def test_shutdown_twice_and_collection_after_shutdown_write_nowhere(tmp_path):
    """A second shutdown, or collecting a shut-down executor, is harmless.

    ``ProcessPoolExecutor.shutdown`` may be called any number of times. Here the
    check is that neither leaves a byte in a file that was opened after the
    first shutdown (and may have been given a descriptor the executor closed).
    """
    script = tmp_path / "twice.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import gc, os, sys
            sys.path.insert(0, {TESTS_DIR!r})
            import jobs
            from dbexecutor import DBExecutor

            if __name__ == "__main__":
                ex = DBExecutor({f"sqlite:///{tmp_path / 'twice.db'}"!r}, 1, poll_interval=0.05)
                print("RESULT", ex.submit(jobs.add, 1, 2).result(timeout=60), flush=True)
                ex.shutdown(wait=True)
                # Files opened now get the lowest free descriptors, as a new
                # database connection or socket would.
                files = [open(os.path.join({str(tmp_path)!r}, f"victim{{i}}"), "w+b") for i in range(20)]
                ex.shutdown(wait=True)
                ex.shutdown(wait=False, cancel_futures=True)
                del ex
                gc.collect()
                dirty = []
                for f in files:
                    f.flush()
                    with open(f.name, "rb") as g:
                        if g.read():
                            dirty.append(os.path.basename(f.name))
                print("DIRTY", dirty, flush=True)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert "RESULT 3" in proc.stdout, proc.stdout + proc.stderr
    assert "DIRTY []" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
