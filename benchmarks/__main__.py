"""``python -m benchmarks``: the same as ``python benchmarks/run.py``."""

from benchmarks.run import main


def script_noop(x: int) -> int:
    """A job function of the program's own ``__main__``, as a user's script has (the throughput scenario's second row)."""
    return x


if __name__ == "__main__":  # children re-import the main module under another name
    raise SystemExit(main())
