"""attach(): futures of existing jobs, by id, by key, and for everything unfinished."""

from __future__ import annotations

import os

import pytest

import jobs
from dbexecutor import DBExecutor

T = 60


def test_attach_hands_back_futures_by_id_key_and_unfinished(db, tmp_path):
    flag = str(tmp_path / "go")
    first = db.executor(1)
    done = first.options(key="done-one").submit(jobs.square, 7)
    assert done.result(timeout=T) == 49
    failed = first.submit(jobs.fail, "stored failure")
    with pytest.raises(jobs.CustomError):
        failed.result(timeout=T)
    held = first.options(key="held").submit(jobs.wait_for_file, flag, "released", 30)
    later = first.options(key="later").submit(jobs.add, held, "!")
    first.shutdown(wait=False)

    ex = DBExecutor.attach(db.url, max_workers=2, **db.options)
    db.executors.append(ex)
    # Finished jobs resolve at once from the stored result or exception.
    assert ex.future(done.job_id).result(timeout=5) == 49
    assert ex.future(key="done-one").result(timeout=5) == 49
    with pytest.raises(jobs.CustomError, match="stored failure"):
        ex.future(failed.job_id).result(timeout=5)
    # Unfinished ones resolve when they finish, whoever runs them.
    unfinished = {f.job_id for f in ex.futures()}
    assert unfinished == {held.job_id, later.job_id}
    by_key = ex.future(key="later")
    assert by_key.job_id == later.job_id and not by_key.done()
    open(flag, "w").close()
    assert by_key.result(timeout=T) == "released!"
    assert ex.future(key="held").result(timeout=T) == "released"
    with pytest.raises(KeyError):
        ex.future(key="no such key")
    with pytest.raises(KeyError):
        ex.future(10**9)
    with pytest.raises(TypeError):
        ex.future()
    assert os.path.exists(flag)
