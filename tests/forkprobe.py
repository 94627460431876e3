"""A process target that imports nothing of dbexecutor: what its process had loaded before it ran."""

from __future__ import annotations

import sys
from typing import Any


def loaded(queue: Any) -> None:
    """Put which of dbexecutor's and SQLAlchemy's modules this process had when it started."""
    queue.put({name: name in sys.modules for name in ("dbexecutor.child", "sqlalchemy")})
