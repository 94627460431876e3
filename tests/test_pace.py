"""The scheduler's arithmetic and wake-ups, without a database or a child process."""

from __future__ import annotations

import array
import fcntl
import termios
import time
from multiprocessing.connection import wait

from dbexecutor.pace import Pace
from dbexecutor.wakeup import DueTimes, Wakeup


def _short_history(pace: Pace, seconds: float, n: int = 10) -> None:
    for _ in range(n):
        pace.job_ended(seconds)


def test_one_job_per_child_until_recent_jobs_are_known_to_be_short():
    pace = Pace()
    assert pace.depth() == 1
    _short_history(pace, 0.001, n=3)
    assert pace.depth() == 1  # too few results to trust the average
    _short_history(pace, 0.001, n=30)
    assert 2 <= pace.depth() <= 512


def test_long_jobs_get_no_queue_and_the_task_limit_caps_the_depth():
    pace = Pace()
    _short_history(pace, 3.0, n=20)
    assert pace.depth() == 1


def test_jobs_under_a_second_get_the_next_one_queued_behind_them():
    pace = Pace()
    _short_history(pace, 0.5, n=20)
    assert pace.depth() == 2  # the child goes straight on when its job ends
    _short_history(pace, 0.05, n=20)
    assert pace.depth() == 2
    _short_history(pace, 1.5, n=30)
    assert pace.depth() == 1
    assert Pace().depth() == 1  # nothing known yet
    _short_history(pace, 0.0001, n=60)
    assert 450 <= pace.depth() < 512  # about 50 ms of such jobs
    assert pace.depth(tasks_done=3, max_tasks_per_child=5) == 2
    _short_history(pace, 0.000001, n=80)
    assert pace.depth() == 512  # the cap, however short the jobs


def test_linger_only_when_the_held_jobs_end_within_a_transaction():
    pace = Pace()
    _short_history(pace, 0.001, n=30)
    assert pace.linger_budget(longest_queue=3) == 0.0  # no transaction measured yet
    pace.tick_recorded(0.01)
    assert pace.linger_budget(longest_queue=0) == 0.0  # nothing held
    assert 0.0 < pace.linger_budget(longest_queue=3) <= pace.linger_max
    assert pace.linger_budget(longest_queue=1000) == 0.0  # longer than a transaction: record now
    pace.tick_cost = pace.linger_max = 30.0  # a test's pin: wait for any short job
    assert pace.linger_budget(longest_queue=1000) == 30.0


def test_due_times_report_the_next_one_and_consume_the_past():
    dues = DueTimes()
    now = time.time()
    assert dues.until_next(now) is None
    dues.add(now + 5)
    dues.add(now - 1)
    assert dues.until_next(now) == 0.0  # one passed: look for work now
    assert 4.9 < dues.until_next(now) <= 5.0
    assert dues.until_next(now + 6) == 0.0
    assert dues.until_next(now + 6) is None


def _unread(fd: int) -> int:
    size = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, size)
    return size[0]


def test_a_pending_wake_up_covers_later_ones_and_a_closed_pipe_is_never_written():
    wake = Wakeup()
    assert wait([wake.reader], 0) == []
    wake.wake()
    wake.wake(work=True)
    assert _unread(wake.reader) == 1  # one byte for both
    wake.consume()
    assert wait([wake.reader], 0) == []
    wake.wake()
    assert _unread(wake.reader) == 1  # consumed: the next wake-up writes again
    assert wake.take_work_hint() and not wake.take_work_hint()
    wake.close()
    wake.wake()  # after close: nothing is written anywhere
    wake.consume()
    wake.close()
