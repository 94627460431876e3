"""The program's own functions, pickled by value once and reused while nothing they capture has changed.

A function defined in the program's ``__main__`` (a script, ``python -c``, a
notebook) cannot be pickled by reference: another process would look for it
in its own ``__main__``. It travels by value (cloudpickle: its code, defaults,
closure and the globals it names), which costs 20–70 µs a call against 2–4
for a reference; a script that submits the same function ten thousand times
paid that ten thousand times, more than the rest of its submit.

So the by-value pickle of such a function is made once and embedded, as
bytes, in each payload that calls it (:class:`FunctionByValue`). It is
reused only while everything cloudpickle captured is the same: the
function's code, defaults, closure and attributes, and each global its code
names (or that name's absence), compared by identity; and only when every
captured value is one a pickle cannot tell apart from a later state of it
(numbers, strings, bytes, tuples and frozensets of those, modules and
functions or classes pickled by reference, and the program's functions that
follow the same rule). A function that captures a list, a dict, an instance
or a class of the program is pickled afresh each call, as before, so a
payload always holds what the function would see if pickled at submit.

A pickle used a second time can also leave the payload altogether
(:class:`StoredFunction`): the store writes it once to its ``functions``
table, named by its SHA-256, and the payload holds that name (46 bytes
instead of 500-2,000, in every row and on every write of it). The
parent that dispatches such a job finds the names in the payload
(:func:`stored_in`) and sends each child the pickles it has not had
(:func:`register`); the child loads them by name (:func:`load_stored`).
"""

from __future__ import annotations

import hashlib
import operator
import pickle
import sys
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple, Protocol

from .errors import CannotRunHere

__all__ = [
    "EmbeddedCall", "FunctionByValue", "References", "StoredFunction", "embed_call", "embedded", "load_function",
    "load_stored", "mentions", "register", "stored_in",
]

#: The module names under which a program's own definitions live (a child's copy of the script is ``__mp_main__``).
MAIN_MODULES = ("__main__", "__mp_main__")

_MISSING = object()  # a name the function's globals did not hold
# Values whose pickle depends on nothing that can change in place.
_ATOMS = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis), range)
_MAX_ITEMS = 256  # a larger tuple or frozenset global is not looked into (the function is pickled afresh)


# Functions rebuilt from their by-value pickles, the most recently used last.
_loaded: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()
_loaded_lock = threading.Lock()
_MAX_LOADED = 64


def load_function(python: tuple[int, int], data: bytes) -> Callable[..., Any]:
    """Rebuild a function pickled by value (the unpickling side of :class:`FunctionByValue`).

    The same pickle gives the same function while it stays among the last
    64 loaded: rebuilding costs 10–30 µs a job, and, as in a
    ``ProcessPoolExecutor``'s worker, whatever a job leaves in its module's
    globals (a model loaded once, a cache) is there for the next job of
    that function in the same process.
    """
    if tuple(python) != sys.version_info[:2]:
        made, here = ".".join(map(str, python)), ".".join(map(str, sys.version_info[:2]))
        raise CannotRunHere(f"it was pickled by value on Python {made}, and this is Python {here}")
    with _loaded_lock:
        fn = _loaded.get(data)
        if fn is not None:
            _loaded.move_to_end(data)
            return fn
    fn = pickle.loads(data)
    with _loaded_lock:
        fn = _loaded.setdefault(data, fn)  # another thread's, if it loaded the same meanwhile
        if len(_loaded) > _MAX_LOADED:
            _loaded.popitem(last=False)
    return fn


class FunctionByValue:
    """A function's by-value pickle, embedded in a payload: it unpickles as the function itself."""

    __slots__ = ("python", "data", "mentions", "reused", "_stored")

    def __init__(self, python: tuple[int, int], data: bytes) -> None:
        self.python: tuple[int, int] = (python[0], python[1])
        self.data = data
        #: How often the pickle holds each name of ``__main__`` (a payload holding more has arguments that refer to it).
        self.mentions = mentions(data)
        #: Whether a payload has taken it before (a pickle made for one call stays in its payload).
        self.reused = False
        self._stored: StoredFunction | None = None

    @property
    def stored(self) -> StoredFunction:
        """This pickle named by its digest, for a payload whose store holds the pickle itself."""
        if self._stored is None:
            self._stored = StoredFunction(self.python, hashlib.sha256(self.data).hexdigest())
        return self._stored

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (load_function, (self.python, self.data))


#: What a stored function's name starts with in a payload (the SHA-256's 32 bytes follow): :func:`stored_in` looks for it.
_MARK = b"dbexecutor.fn:"
_DIGEST_BYTES = 32


class StoredFunction:
    """A by-value pickle named by its SHA-256 in a payload; the store's ``functions`` table holds the pickle."""

    __slots__ = ("python", "digest", "_name")

    #: The payload's own text holds none of ``__main__``'s names for it.
    mentions = (0, 0)

    def __init__(self, python: tuple[int, int], digest: str) -> None:
        self.python: tuple[int, int] = (python[0], python[1])
        self.digest = digest  # hex, as the table's key spells it
        self._name = _MARK + bytes.fromhex(digest)  # in the payload: 46 bytes

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (load_stored, (self.python, self._name))


# The pickles this process was sent, by digest (a child's, filled by its parent before each call).
_registry: dict[str, bytes] = {}


def register(functions: Iterable[tuple[str, bytes]]) -> None:
    """Keep the by-value pickles ``(digest, data)`` that payloads here name (:func:`load_stored` reads them)."""
    for digest, data in functions:
        _registry[digest] = data


def load_stored(python: tuple[int, int], name: bytes) -> Callable[..., Any]:
    """Rebuild a function a payload names by its digest, from the pickle :func:`register` was given."""
    digest = name[len(_MARK):].hex()
    data = _registry.get(digest)
    if data is None:
        raise CannotRunHere(
            f"its function's by-value pickle (sha256 {digest[:16]}...) is not in the database's functions table"
        )
    return load_function(python, data)


def stored_in(payload: bytes) -> list[str]:
    """The digests (hex) of the stored functions ``payload`` names, found in its bytes without unpickling it.

    A pickle holds a bytes object's contents as they are, so every name is
    found; an argument's bytes that happen to look like one name a pickle
    the child does not need, which costs nothing but its sending.
    """
    found: list[str] = []
    at = payload.find(_MARK)
    while at >= 0:
        start = at + len(_MARK)
        digest = payload[start:start + _DIGEST_BYTES]
        if len(digest) == _DIGEST_BYTES:
            found.append(digest.hex())
        at = payload.find(_MARK, start)
    return found


class References(Protocol):
    """Where the program's functions may go by name: the pickle is in the database, or None (embed it)."""

    def __call__(self, made: FunctionByValue) -> StoredFunction | None: ...


def mentions(data: bytes) -> tuple[int, int]:
    """How many times ``data`` holds ``__main__`` and ``__mp_main__``."""
    return data.count(b"__main__"), data.count(b"__mp_main__")


class _Captured:
    """What a by-value pickle of a function took from its surroundings, to tell later whether it still holds."""

    __slots__ = ("functions", "names")

    def __init__(self) -> None:
        self.functions: list[tuple[types.FunctionType, tuple[Any, ...]]] = []  # (function, _attributes(function))
        self.names: list[tuple[dict[str, Any], str, Any]] = []  # (globals, name, value or _MISSING)

    def holds(self) -> bool:
        """Whether every captured value is still in place (identity), and no function has grown attributes."""
        for fn, attrs in self.functions:
            now = _attributes(fn)
            if fn.__dict__ or len(now) != len(attrs) or not all(map(operator.is_, now, attrs)):
                return False
        return all(namespace.get(name, _MISSING) is value for namespace, name, value in self.names)


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return _MISSING


def _attributes(fn: types.FunctionType) -> tuple[Any, ...]:
    """What of ``fn`` itself goes into its by-value pickle, to be compared item by item by identity.

    Code, defaults, keyword defaults (the dict and each value: it can be
    changed in place), the closure cells' contents, annotations, names,
    module and docstring.
    """
    kw = fn.__kwdefaults__
    cells = tuple(_cell_contents(c) for c in fn.__closure__) if fn.__closure__ else ()
    return (
        fn.__code__, fn.__defaults__, kw, *(kw.values() if kw else ()), len(cells), *cells,
        fn.__annotations__, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__,
    )


def _names(code: types.CodeType) -> Iterator[str]:
    """Every name ``code`` and the code nested in it (lambdas, comprehensions, inner functions) look up."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _by_reference(obj: Any) -> bool:
    """Whether cloudpickle pickles ``obj`` (a function, class or module) by its importable name."""
    import cloudpickle  # type: ignore[import-untyped]

    by_value = cloudpickle.list_registry_pickle_by_value()
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
        return name not in MAIN_MODULES and name not in by_value and sys.modules.get(name) is obj
    module_name = getattr(obj, "__module__", None)
    if not isinstance(module_name, str) or module_name in MAIN_MODULES:
        return False
    if module_name.partition(".")[0] in by_value or module_name in by_value:
        return False
    found: Any = sys.modules.get(module_name)
    for part in getattr(obj, "__qualname__", "<>").split("."):
        found = getattr(found, part, None)
    return found is obj


class _Capture:
    """Walks what a by-value pickle of a function would take, recording it, or finds a value that may change."""

    def __init__(self) -> None:
        self.captured = _Captured()
        self._seen: set[int] = set()

    def function(self, fn: types.FunctionType) -> bool:
        if id(fn) in self._seen:
            return True  # recursion between the program's functions
        self._seen.add(id(fn))
        if fn.__dict__:
            return False  # attributes set on the function: any of them may be changed in place
        attrs = _attributes(fn)
        self.captured.functions.append((fn, attrs))
        kw = fn.__kwdefaults__ or {}
        cells = [_cell_contents(c) for c in fn.__closure__ or ()]
        values = [*(fn.__defaults__ or ()), *kw.values(), *(c for c in cells if c is not _MISSING)]
        if not all(self.value(v) for v in values):
            return False
        namespace = fn.__globals__
        for name in dict.fromkeys(_names(fn.__code__)):
            value = namespace.get(name, _MISSING)
            self.captured.names.append((namespace, name, value))
            if value is not _MISSING and not self.value(value):
                return False
        return True

    def value(self, obj: Any) -> bool:
        if type(obj) in _ATOMS:
            return True
        if type(obj) in (tuple, frozenset):
            return len(obj) <= _MAX_ITEMS and all(self.value(x) for x in obj)
        if isinstance(obj, (types.ModuleType, types.BuiltinFunctionType, type)) or callable(obj) and hasattr(obj, "__qualname__"):
            if _by_reference(obj):
                return True
            # The program's own function, by value in turn; a class of the program is not followed (its
            # attributes and methods can change in place).
            return type(obj) is types.FunctionType and self.function(obj)
        return False


class _Cache:
    """By-value pickles of the program's functions, kept while the function lives."""

    def __init__(self) -> None:
        self._entries: weakref.WeakKeyDictionary[types.FunctionType, tuple[FunctionByValue, _Captured]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def embedded(self, fn: Any) -> FunctionByValue | None:
        if type(fn) is not types.FunctionType or fn.__module__ not in MAIN_MODULES:
            return None
        with self._lock:
            entry = self._entries.get(fn)
        if entry is not None and entry[1].holds():
            entry[0].reused = True
            return entry[0]
        capture = _Capture()
        if not capture.function(fn):
            return None
        import cloudpickle

        made = FunctionByValue(sys.version_info[:2], cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL))
        with self._lock:
            self._entries[fn] = (made, capture.captured)
        return made


_cache = _Cache()


class EmbeddedCall(NamedTuple):
    """A call with the program's functions in it replaced by their by-value pickles."""

    parts: tuple[Any, tuple[Any, ...], dict[str, Any]]  # (fn, args, kwargs), to pickle as they are
    mentions: tuple[int, int]  # how often the embedded pickles hold each name of __main__, together


def _is_programs(obj: Any) -> bool:
    return type(obj) is types.FunctionType and obj.__module__ in MAIN_MODULES


def _names_programs(values: Iterable[Any]) -> bool:
    """Whether ``values`` hold a function of the program (checked one by one only if they hold a function)."""
    return types.FunctionType in map(type, values) and any(map(_is_programs, values))


def embed_call(
    fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], reference: References | None = None
) -> EmbeddedCall | None:
    """``fn(*args, **kwargs)`` with ``fn`` and each argument that is a function of the program embedded by value.

    None if none is, or if one captures what may change in place (the
    caller pickles the whole call by value instead). ``reference``: names
    a pickle the database holds instead of embedding it, where it can.
    """
    # Most calls have neither: found without a Python call per argument (and a map chunk's
    # function, an argument of run_chunk, is most often a module's).
    if not _is_programs(fn) and not _names_programs(args) and not (kwargs and _names_programs(kwargs.values())):
        return None
    made: dict[int, FunctionByValue | StoredFunction] = {}

    def swap(obj: Any) -> Any:
        if not _is_programs(obj):
            return obj
        found = made.get(id(obj))
        if found is None:
            pickled = _cache.embedded(obj)
            if pickled is None:
                raise _Unembeddable
            found = (reference(pickled) if reference is not None else None) or pickled
            made[id(obj)] = found
        return found

    try:
        parts = (swap(fn), tuple(map(swap, args)), {k: swap(v) for k, v in kwargs.items()} if kwargs else kwargs)
    except _Unembeddable:
        return None
    if not made:
        return None  # only other modules' functions
    # Each distinct function once: the pickle memoizes a repeated object.
    return EmbeddedCall(parts, (sum(e.mentions[0] for e in made.values()), sum(e.mentions[1] for e in made.values())))


class _Unembeddable(Exception):
    """A function of the program that must be pickled afresh."""


def embedded(fn: Any) -> FunctionByValue | None:
    """``fn``'s by-value pickle for a payload, made once and reused while what it captured holds.

    None if ``fn`` is not a plain function of the program's ``__main__``, or
    if it captures a value that could change in place (the caller pickles it
    afresh, as a whole).
    """
    return _cache.embedded(fn)
