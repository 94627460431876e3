"""What the package says about itself: its version, once, and its license."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

import dbexecutor
from clitools import cli_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_on_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "dbexecutor", "--version"], capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"dbexecutor {dbexecutor.__version__}\n"


def test_the_version_is_written_once():
    tomllib = pytest.importorskip("tomllib")  # 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dbexecutor.__version__"}
    try:
        installed = importlib.metadata.version("dbexecutor")
    except importlib.metadata.PackageNotFoundError:
        return  # run from the source tree
    assert installed == dbexecutor.__version__, "the installed metadata is stale: reinstall (pip install -e .)"


def test_the_license_is_mit_and_shipped():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]  # SPDX replaces them
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("MIT License") and "dbexecutor developers" in text
