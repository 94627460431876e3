"""Queues: which executors may run a job.

Every job goes to one queue; every executor and worker serves a list of
queues, or every queue. The defaults keep programs apart::

    python report.py       submits to "report"        serves "report" and "default"
    python -m app.tasks    submits to "app.tasks"     serves "app.tasks" and "default"
    python -c / notebook   submits to "default"       serves "default"
    DBExecutor.attach(url)                            serves every queue (it resumes the database)
    dbexecutor worker URL                             serves every queue, or those named by --queue

so two unrelated scripts on one database never take each other's jobs, the
same script run again (or attached) picks its own up, and a worker started
for a queue runs what was submitted to it. ``default`` is the shared queue:
rows written before queues existed are there, and so are jobs submitted from
an interactive session.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

from .byvalue import MAIN_MODULES
from .states import DEFAULT_QUEUE

__all__ = ["EVERY", "program_queue", "serving", "check_name"]

#: Serve every queue (``queues="*"``, ``dbexecutor worker --queue '*'``).
EVERY = "*"

_NAME = re.compile(r"^[^\s,*][^,]{0,254}$")


def check_name(name: object) -> str:
    """``name`` if it can be a queue's name, else ``ValueError`` saying why."""
    if not isinstance(name, str) or not _NAME.match(name) or name != name.strip():
        raise ValueError(
            f"a queue name is a non-empty string of at most 255 characters, without commas, '*' "
            f"or surrounding spaces; got {name!r}"
        )
    return name


def program_queue() -> str:
    """The queue named after this program: its ``-m`` module, or its script's name; ``default`` when it has neither."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name and name not in MAIN_MODULES:
        text = str(name)
        return text[: -len(".__main__")] if text.endswith(".__main__") else text
    path = getattr(main, "__file__", None)
    if path:
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem == "__main__":  # python some/dir (a directory or zip with __main__.py)
            stem = os.path.basename(os.path.dirname(os.path.abspath(path))) or stem
        return stem or DEFAULT_QUEUE
    return DEFAULT_QUEUE  # python -c, standard input, an interactive session, a notebook


def serving(queues: str | Iterable[str] | None, *, default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The queues an executor serves, as given (``"*"`` or ``None`` for every queue where ``default`` is None).

    ``queues`` may be one name, several, or ``"*"``; ``None`` takes ``default``.
    Returns a tuple of names, or None for every queue.
    """
    if queues is None:
        return default
    if isinstance(queues, str):
        queues = [queues]
    names = list(queues)
    if EVERY in names:
        if len(names) > 1:
            raise ValueError("queues='*' serves every queue: give it alone")
        return None
    if not names:
        raise ValueError("an executor that runs jobs serves at least one queue (or '*' for every queue)")
    return tuple(dict.fromkeys(check_name(n) for n in names))
