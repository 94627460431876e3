"""URLs a new user gets wrong are refused with a message that says what to write instead."""

from __future__ import annotations

import pytest

from dbexecutor import ConfigurationError, DBExecutor
from dbexecutor.store import Store


def test_two_slashes_is_not_an_in_memory_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as info:
        DBExecutor("sqlite://jobs.db")
    assert "sqlite:///jobs.db" in str(info.value) and "memory" not in str(info.value)
    assert not (tmp_path / "jobs.db").exists()


def test_a_file_that_is_not_a_database_is_named(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("these are not the tables you are looking for\n" * 100)
    with pytest.raises(ConfigurationError) as info:
        Store(f"sqlite:///{notes}")
    assert str(notes) in str(info.value) and "not an SQLite database" in str(info.value)


def test_a_directory_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "jobs.db"
    with pytest.raises(ConfigurationError) as info:
        Store(f"sqlite:///{missing}")
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("url", [None, 42, b"sqlite:///x.db"])
def test_a_url_that_is_not_text_is_refused(url):
    with pytest.raises(ConfigurationError) as info:
        Store(url)
    assert "a database URL is needed" in str(info.value)
