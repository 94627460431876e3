"""The executors every scenario runs beside dbexecutor, on the same workload.

``ProcessPoolExecutor`` always; loky and pebble when they are importable.
Pebble's ``ProcessPool`` has ``schedule`` and a ``map`` that returns a future
of an iterator, so a thin adapter gives it the ``Executor`` shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

Factory = Callable[[int], Executor]


class PebbleExecutor(Executor):
    """``pebble.ProcessPool`` behind ``submit`` / ``map`` / ``shutdown``."""

    def __init__(self, max_workers: int) -> None:
        import pebble

        self._pool = pebble.ProcessPool(max_workers=max_workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return self._pool.schedule(fn, args=args, kwargs=kwargs)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1) -> Iterator[Any]:
        return iter(self._pool.map(fn, *iterables, chunksize=chunksize).result())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.close()
        if wait:
            self._pool.join()


def _loky(max_workers: int) -> Executor:
    import loky

    return loky.ProcessPoolExecutor(max_workers=max_workers)


def available() -> dict[str, Factory]:
    """Name -> factory for every baseline this interpreter can run (``ppe`` first)."""
    found: dict[str, Factory] = {"ppe": ProcessPoolExecutor}
    try:
        import loky  # noqa: F401

        found["loky"] = _loky
    except ImportError:
        pass
    try:
        import pebble  # noqa: F401

        found["pebble"] = PebbleExecutor
    except ImportError:
        pass
    return found


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("loky", "pebble"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = None
    return out
