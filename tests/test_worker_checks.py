"""``dbexecutor worker`` refuses to start where it could only wait forever or fail later."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy.engine import make_url

from clitools import cli_env
from dbexecutor.store import Store

T = 60


def _worker(*args: str) -> subprocess.CompletedProcess[str]:
    # A worker that starts serving would never return: the timeout turns that into a failure.
    return subprocess.run(
        [sys.executable, "-m", "dbexecutor", "worker", *args],
        capture_output=True, text=True, env=cli_env(), timeout=T,
    )


def test_a_worker_refuses_a_sqlite_file_that_does_not_exist(tmp_path):
    missing = tmp_path / "typo" / "jobs.db"
    proc = _worker(f"sqlite:///{missing}")
    assert proc.returncode == 4, proc.stderr
    assert "no database at" in proc.stderr and str(missing) in proc.stderr
    assert "dbexecutor migrate" in proc.stderr
    assert not missing.exists() and not missing.parent.exists()
    nearby = tmp_path / "jobs.db"
    proc = _worker(f"sqlite:///{nearby}", "--max-workers", "1")
    assert proc.returncode == 4 and not nearby.exists(), proc.stderr


def test_a_worker_refuses_a_path_that_is_not_a_directory(db, tmp_path):
    a_file = tmp_path / "module.py"
    a_file.write_text("")
    for path, what in [(tmp_path / "nope", "does not exist"), (a_file, "is not a directory")]:
        proc = _worker(db.url, "--prefix", db.prefix, "--path", str(tmp_path), "--path", str(path))
        assert proc.returncode == 2, proc.stderr
        assert f"--path {path} {what}" in proc.stderr, proc.stderr
    # Refused before anything was created.
    if db.kind == "sqlite":
        assert not os.path.exists(make_url(db.url).database)
    else:
        store = Store(db.url, db.prefix, create=False)
        try:
            assert not store.schema_present()
        finally:
            store.close()
