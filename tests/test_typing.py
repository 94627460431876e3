"""The public API's types, checked by mypy over tests/typing_check.py (skipped where mypy is not installed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_public_api_is_typed(tmp_path):
    pytest.importorskip("mypy")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--warn-unused-ignores", "--no-incremental",
         "--cache-dir", str(tmp_path), "--follow-imports=silent", os.path.join(HERE, "typing_check.py")],
        capture_output=True, text=True, timeout=300, cwd=os.path.dirname(HERE),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
