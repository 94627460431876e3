"""``python -m dbexecutor.cli``: the command line, as ``python -m dbexecutor`` runs it (the module ``cli.py`` ran itself so)."""

from __future__ import annotations

from .run import main_exit

if __name__ == "__main__":
    main_exit()
