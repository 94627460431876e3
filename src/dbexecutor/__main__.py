"""``python -m dbexecutor``: the command line (see :mod:`dbexecutor.cli`)."""

import sys

from .cli import main

sys.exit(main())
