"""A job can finish before the thread that wrote its row tracks it: its future still gets the result.

``Registry.write_and_track`` does not hold the registry's lock across the
insert (the loop would wait for every durable submit's round trip and
commit to resolve other futures). A final row the loop resolves in between,
for a job nobody tracks yet, is kept while a write is in progress and
applied when that write tracks the job.
"""

from __future__ import annotations

import pickle
import threading

from dbexecutor import schema
from dbexecutor.records import Final, Submitted
from dbexecutor.registry import Registry
from dbexecutor.serialization import Signer


def _registry() -> Registry:
    return Registry(None, ("test",), Signer(None))  # type: ignore[arg-type]


def test_a_job_resolved_while_its_write_is_in_progress_resolves_when_tracked():
    registry = _registry()
    blob = pickle.dumps(42)

    def write() -> list[Submitted]:
        # The loop claims, runs and finishes the job between the commit and the tracking.
        done = threading.Thread(target=registry.resolve, args=(Final(7, schema.DONE, blob),))
        done.start()
        done.join(timeout=5)
        # Before: resolve() waited for the registry's lock, held across the whole write.
        assert not done.is_alive(), "the loop waited for a write in progress"
        return [Submitted(7, schema.READY)]

    fut = registry.new_future()
    rows, futures = registry.write_and_track(write, [fut])
    assert futures == [fut] and fut.job_id == 7
    assert fut.result(timeout=0) == 42
    assert not registry.has_outstanding()


def test_finals_of_other_jobs_are_not_kept_after_the_write():
    registry = _registry()
    registry.write_and_track(lambda: [registry.resolve(Final(99, schema.DONE, None)) or Submitted(1, schema.READY)])
    assert registry._early == {}  # another process's job: forgotten once no write is in progress
    registry.resolve(Final(98, schema.DONE, None))
    assert registry._early == {}  # nothing kept while nothing is being written
