"""``python -m benchmarks``: the same as ``python benchmarks/run.py``."""

from benchmarks.run import main

if __name__ == "__main__":  # children re-import the main module under another name
    raise SystemExit(main())
