"""``python -m dbexecutor`` and the installed ``dbexecutor`` script: the command line (see :mod:`dbexecutor.cli`).

This module stays light on purpose. A worker's children come from a fork
server that imports their code once; started here, before the command line
imports SQLAlchemy and the database driver (about 0.3 s), it does that on
another core meanwhile, and the worker's first job no longer waits for it.
"""

from __future__ import annotations

import importlib.machinery
import sys

__all__ = ["main"]


def main() -> None:
    """Run the command line with this process's arguments and exit with its status."""
    _as_package_main()
    if sys.argv[1:2] == ["worker"]:  # the parser has no options before the command
        from .pool import default_context, warm_up

        warm_up(default_context())
    from .cli import main as run

    sys.exit(run())


def _as_package_main() -> None:
    """Name this process's ``__main__`` (the installed ``dbexecutor`` script) as ``python -m dbexecutor`` does.

    multiprocessing imports a parent's main script again in every child it
    starts (and the fork server preloads it), so that functions defined there
    can be found. This script's one import is the command line, and SQLAlchemy
    with it: a worker's children would load the database stack they never use
    (and the first one would wait for it). A main module named
    ``<package>.__main__`` is not imported again. No job is ever defined in
    this script.
    """
    main_module = sys.modules.get("__main__")
    spec = getattr(main_module, "__spec__", None)
    if main_module is not None and (spec is None or spec.name == "dbexecutor.cli"):
        main_module.__spec__ = importlib.machinery.ModuleSpec("dbexecutor.__main__", None)


if __name__ == "__main__":
    main()
