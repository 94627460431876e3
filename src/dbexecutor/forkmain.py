"""Imported only in the fork server (see :func:`dbexecutor.pool.warm_up`): the program's main script, loaded once there.

A child that ``forkserver`` starts imports its parent's main script before
anything else, so that the functions defined there can be found: the script's
imports (SQLAlchemy, the driver and dbexecutor itself, for a script that
imports ``DBExecutor`` at its top) ran again in every child, 0.2–0.4 s of
CPU each and the memory they take. Listing ``"__main__"`` among the fork
server's preloads was meant to do it once, in the server, but from Python 3.4
to 3.13.7 the server never receives the script's path (CPython issues
126631 and 137996; fixed in 3.13.8 and 3.14), so every child imported it.

The parent puts the script's path, ``sys.argv`` and ``sys.path`` in the
environment variable :data:`ENV` while it starts the server; importing this
module there loads the script as multiprocessing would (as ``__mp_main__``,
with multiprocessing's "importing the main module" flag set), and children
forked afterwards find it loaded. A script whose top level fails or starts an
executor (no ``if __name__ == "__main__":`` guard) is left as it was: its
children import it themselves, as before, and say why they cannot run.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["ENV"]

#: Where the parent says which script the fork server should load (removed once read).
ENV = "DBEXECUTOR_FORKSERVER_MAIN"


def _preload() -> None:
    raw = os.environ.pop(ENV, None)
    if not raw:
        return
    from multiprocessing import process, spawn

    wanted = json.loads(raw)
    path = wanted["path"]
    if getattr(sys.modules.get("__main__"), "__file__", None) == path:
        return  # multiprocessing preloaded it itself (a Python with the fix)
    argv, sys_path = sys.argv, sys.path[:]
    sys.argv, sys.path[:] = list(wanted["argv"]), list(wanted["sys_path"])
    current = process.current_process()
    current._inheriting = True  # type: ignore[attr-defined]  # multiprocessing's own flag, as its preload sets it
    try:
        spawn.import_main_path(path)
    except (Exception, SystemExit):  # noqa: BLE001 - the children import the script themselves, as before
        pass
    finally:
        del current._inheriting  # type: ignore[attr-defined]
        sys.argv, sys.path[:] = argv, sys_path


_preload()
