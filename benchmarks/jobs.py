"""Benchmark job functions (importable by name from children)."""


def noop(x: int) -> int:
    return x
