"""Pickling of payloads, results and exceptions.

Data flow of one job::

    submit(fn, *args)          child                       parent / any reader
    ─────────────────          ─────                       ───────────────────
    futures → JobRef    ──►    JobRef, ArgRef → upstream result
    dump_payload()      ──►    load_payload(), run fn  ──►  load_result() / load_exception()
                               dump_result() or dump_exception()

An exception keeps its ``__cause__`` chain across the pickle (plain pickling
drops it), and the child's formatted traceback becomes a
:class:`RemoteTraceback` cause, as ``ProcessPoolExecutor`` does. Each
exception is stored with its type's name and its message beside its pickle:
a process that cannot rebuild it gets a :class:`~dbexecutor.RemoteError`
that says what it was.

With a secret, every stored pickle is signed (:class:`Signer`) and verified
before it is unpickled: a pickle is code, and the database is shared.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import pickletools
import sys
import traceback
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from . import byvalue
from .errors import CannotRunHere, DependencyFailed, PayloadRejected, RemoteError

PROTOCOL = pickle.HIGHEST_PROTOCOL
_MAX_CAUSE_DEPTH = 8

# -- signing --------------------------------------------------------------------

#: Environment variable read when no secret is passed explicitly.
SECRET_ENV = "DBEXECUTOR_SECRET"
# A signed blob is MAGIC + HMAC-SHA256(context NUL data) + data. Our pickles
# start with the PROTO opcode (0x80), so the two can never be confused.
MAGIC = b"DBXS1\x00"
_MAC_LEN = hashlib.sha256().digest_size

#: What a blob is, folded into its MAC so one kind cannot stand in for another.
PAYLOAD_CONTEXT = b"payload"
ERROR_CONTEXT = b"error"


def result_context(job_id: int) -> bytes:
    """The signing context of job ``job_id``'s result: a result is bound to its job."""
    return b"result:%d" % job_id


def blob_context(job_id: int, state: str) -> bytes:
    """The context of the ``result`` column of a final row (``done``: its result, else an exception)."""
    return result_context(job_id) if state == "done" else ERROR_CONTEXT


class Signer:
    """HMAC-SHA256 signatures on stored pickles.

    Without a secret this is a pass-through: blobs are stored unsigned, and a
    signed blob is read without a check (nothing to check it with). With a
    secret, :meth:`open` refuses (``PayloadRejected``) any blob that is
    unsigned or whose signature does not match, before anything is unpickled.

    What is signed: payloads under the context ``payload``; results under
    ``result:<job id>`` (the child knows the id, so a result cannot be moved
    to another job's row); exceptions under ``error``. Payloads are not bound
    to their row: the id exists only after the insert, and a second write per
    submit would cost every submit a round trip. A payload copied into another
    row is still one that a holder of the secret submitted.
    """

    __slots__ = ("_key",)

    def __init__(self, secret: str | bytes | None) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and not secret:
            raise ValueError("the signing secret must not be empty")
        self._key = secret

    @classmethod
    def from_env(cls, secret: str | bytes | None = None) -> Signer:
        """A signer for ``secret``, or for ``$DBEXECUTOR_SECRET`` when ``secret`` is None."""
        return cls(secret if secret is not None else (os.environ.get(SECRET_ENV) or None))

    @property
    def enabled(self) -> bool:
        """Whether blobs are signed and checked."""
        return self._key is not None

    def __repr__(self) -> str:  # never the key itself
        return f"Signer({'enabled' if self.enabled else 'disabled'})"

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Signer, (self._key,))

    def _mac(self, data: bytes, context: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, context + b"\x00" + data, hashlib.sha256).digest()

    def sign(self, data: bytes, context: bytes) -> bytes:
        """``data`` with its signature in front (``data`` itself without a secret)."""
        if self._key is None:
            return data
        return MAGIC + self._mac(data, context) + data

    def open(self, blob: bytes, context: bytes, what: str = "blob") -> bytes:
        """The pickle inside ``blob`` once its signature checks out; ``PayloadRejected`` if not.

        ``what`` names the blob in the error ("the payload of job 7").
        """
        signed = blob[: len(MAGIC)] == MAGIC
        if self._key is None:
            return blob[len(MAGIC) + _MAC_LEN :] if signed else blob
        if not signed:
            raise PayloadRejected(
                f"{what} is not signed, but a secret is configured; refusing to unpickle it "
                "(was it submitted without the secret, or written by someone else?)"
            )
        mac, data = blob[len(MAGIC) : len(MAGIC) + _MAC_LEN], blob[len(MAGIC) + _MAC_LEN :]
        if not hmac.compare_digest(mac, self._mac(data, context)):
            raise PayloadRejected(
                f"{what} has a signature that does not match (altered in the database, moved from "
                "another row, or signed with another secret); refusing to unpickle it"
            )
        return data


#: The pass-through signer (no secret).
UNSIGNED = Signer(None)


def strip_signature(blob: bytes) -> tuple[bytes, bool]:
    """The pickle inside ``blob`` without any check, and whether it carried a signature (tools only)."""
    if blob[: len(MAGIC)] == MAGIC:
        return blob[len(MAGIC) + _MAC_LEN :], True
    return blob, False


class JobRef:
    """Stands in for a ``JobFuture`` inside a stored payload; the child swaps in the result."""

    __slots__ = ("job_id",)

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (JobRef, (self.job_id,))

    def __repr__(self) -> str:
        return f"JobRef({self.job_id})"


class ArgRef:
    """Stands in for the future of an upstream job not written yet when the payload was pickled.

    ``index`` is the upstream's position in the job's ``arg_refs`` (the ids
    the row records once both are written): a chain submitted faster than
    it is written need not wait for each id to pickle the next link.
    """

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (ArgRef, (self.index,))

    def __repr__(self) -> str:
        return f"ArgRef({self.index})"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child, as text (set as ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def qualified_name(fn: Any) -> str:
    """``module.qualname`` of a callable, for the readable ``fn_name`` column."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"[:255]


def _holds(items: Iterable[Any], kinds: tuple[type, ...]) -> bool:
    """Whether any of ``items`` is an instance of ``kinds`` (their types collected in C, then checked once each)."""
    return any(issubclass(t, kinds) for t in set(map(type, items)))


def _map_shallow(obj: Any, fn: Callable[[Any], Any], kinds: tuple[type, ...]) -> Any:
    """Apply ``fn`` to ``obj`` and, one level down, to the items of a list, tuple or dict, where they are ``kinds``.

    A container with no such item is returned as it is: a ``map`` chunk's
    64 argument tuples, or a list of a million numbers, cost no Python call
    per item.
    """
    t = type(obj)
    if t is list or t is tuple:
        if not _holds(obj, kinds):
            return obj
        return [fn(x) if isinstance(x, kinds) else x for x in obj] if t is list else tuple(
            fn(x) if isinstance(x, kinds) else x for x in obj
        )
    if t is dict:
        if not _holds(obj.values(), kinds):
            return obj
        return {k: fn(v) if isinstance(v, kinds) else v for k, v in obj.items()}
    return fn(obj) if isinstance(obj, kinds) else obj


def map_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], fn: Callable[[Any], Any], kinds: tuple[type, ...]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Apply ``fn`` where a dependency may sit (each argument, each keyword value, and their items) to what is ``kinds``."""
    return (
        tuple([_map_shallow(a, fn, kinds) for a in args]),
        {k: _map_shallow(v, fn, kinds) for k, v in kwargs.items()} if kwargs else {},
    )


# A pickle refers to functions and classes by module and name, and another
# process finds them by importing the module. What a program defines at its top
# level (a script, python -c, standard input, a notebook) lives in its
# ``__main__`` and is nowhere to be found elsewhere: such pickles are made by
# value instead, with cloudpickle, as loky and joblib do. The markers are how
# protocol 4 and later (SHORT_BINUNICODE, then a one-byte length) and earlier
# protocols (GLOBAL, "c", then the name and a newline) spell a reference to
# that module; a child's copy of the parent's script is ``__mp_main__``.
_MAIN_REFERENCES = tuple(
    marker
    for name in (module.encode() for module in byvalue.MAIN_MODULES)
    for marker in (pickle.SHORT_BINUNICODE + bytes([len(name)]) + name, pickle.GLOBAL + name + b"\n")
)
_MAIN_NAMES = tuple(module.encode() for module in byvalue.MAIN_MODULES)


class ByValue:
    """A pickle made by value (cloudpickle), and the Python version that made it (code objects are not portable)."""

    __slots__ = ("python", "data")

    def __init__(self, python: tuple[int, int], data: bytes) -> None:
        self.python = tuple(python)
        self.data = data

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (ByValue, (self.python, self.data))


def _by_value(obj: Any) -> bytes:
    import cloudpickle  # type: ignore[import-untyped]  # only the pickles that need it pay for importing it

    return pickle.dumps(ByValue(sys.version_info[:2], cloudpickle.dumps(obj, protocol=PROTOCOL)), protocol=PROTOCOL)


def _refers_to_main(data: bytes) -> bool:
    """Whether a pickle names something of the program's ``__main__``."""
    # Every marker holds one of these two names: most pickles are cleared by two searches.
    return any(name in data for name in _MAIN_NAMES) and any(marker in data for marker in _MAIN_REFERENCES)


def dumps(obj: Any) -> bytes:
    """Pickle with the highest protocol; by value (see :class:`ByValue`) what refers to the program's ``__main__``."""
    try:
        data = pickle.dumps(obj, protocol=PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        if "__main__" not in str(error):
            raise
        return _by_value(obj)  # a lambda or a nested function of the program: only by value
    return _by_value(obj) if _refers_to_main(data) else data


def loads(data: bytes) -> Any:
    """Unpickle a stored blob (:class:`~dbexecutor.errors.CannotRunHere` if it was made by value on another Python)."""
    obj = pickle.loads(data)
    if type(obj) is ByValue:
        if obj.python != sys.version_info[:2]:
            made, here = ".".join(map(str, obj.python)), ".".join(map(str, sys.version_info[:2]))
            raise CannotRunHere(f"it was pickled by value on Python {made}, and this is Python {here}")
        return pickle.loads(obj.data)
    return obj


def dump_payload(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    signer: Signer = UNSIGNED,
    reference: byvalue.References | None = None,
) -> bytes:
    """Pickle (and sign) what a child needs to run the job (futures already replaced by ``JobRef``).

    The program's own functions (the one called, and any argument that is
    one, as ``map``'s chunks pass it) go in as their by-value pickles, made
    once and reused while what they captured holds (:mod:`~dbexecutor.byvalue`);
    only arguments that otherwise refer to ``__main__`` make the whole call
    go by value. ``reference``: where such a pickle may be named by its
    digest instead (the store holds it: :class:`~dbexecutor.byvalue.StoredFunction`).
    """
    call = byvalue.embed_call(fn, args, kwargs, reference)
    if call is not None:
        try:
            data = pickle.dumps(call.parts, protocol=PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            if "__main__" not in str(error):
                raise
        else:
            # The embedded pickles name __main__ (their module): the rest of the call may not add to it.
            if byvalue.mentions(data) == call.mentions:
                return signer.sign(data, PAYLOAD_CONTEXT)
        # Something else of __main__ is in the arguments: the whole call by value, with
        # no third pickling by reference that would only find that out again.
        return signer.sign(_by_value((fn, args, kwargs)), PAYLOAD_CONTEXT)
    return signer.sign(dumps((fn, args, kwargs)), PAYLOAD_CONTEXT)


def load_payload(
    data: bytes, signer: Signer = UNSIGNED, job_id: int | None = None
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dump_payload`; ``PayloadRejected`` before unpickling if the signature fails."""
    fn, args, kwargs = loads(signer.open(data, PAYLOAD_CONTEXT, f"the payload of job {job_id}"))
    return fn, args, kwargs


def dump_result(value: Any, job_id: int, signer: Signer = UNSIGNED) -> bytes:
    """Pickle (and sign, bound to ``job_id``) a job's return value."""
    return signer.sign(dumps(value), result_context(job_id))


def load_result(data: bytes, job_id: int, signer: Signer = UNSIGNED) -> Any:
    """Inverse of :func:`dump_result`; ``PayloadRejected`` before unpickling if the signature fails."""
    return loads(signer.open(data, result_context(job_id), f"the result of job {job_id}"))


# What a loaded payload holds in place of an upstream's result.
_PLACEHOLDERS: tuple[type, ...] = (JobRef, ArgRef)


def _upstream_id(x: Any, refs: Sequence[int]) -> int | None:
    """The upstream job id a placeholder stands for (None: not a placeholder)."""
    if type(x) is JobRef:
        return x.job_id
    if type(x) is ArgRef:
        if not 0 <= x.index < len(refs):
            raise RuntimeError(f"the payload names upstream result {x.index}, but the row records {len(refs)}")
        return refs[x.index]
    return None


def collect_refs(args: tuple[Any, ...], kwargs: dict[str, Any], refs: Sequence[int] = ()) -> list[int]:
    """Job ids of the ``JobRef`` and ``ArgRef`` placeholders in a loaded payload (``refs``: the row's ``arg_refs``)."""
    found: list[int] = []

    def visit(x: Any) -> Any:
        job_id = _upstream_id(x, refs)
        if job_id is not None:
            found.append(job_id)
        return x

    map_arguments(args, kwargs, visit, _PLACEHOLDERS)
    return found


def resolve_refs(
    args: tuple[Any, ...], kwargs: dict[str, Any], results: dict[int, Any], refs: Sequence[int] = ()
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Replace each placeholder by the upstream job's result."""

    def swap(x: Any) -> Any:
        job_id = _upstream_id(x, refs)
        return x if job_id is None else results[job_id]

    return map_arguments(args, kwargs, swap, _PLACEHOLDERS)


class _BatchResult:
    """A batch's stored result: its children's result pickles, loaded as one list."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_load_batch, (self.blobs,))


def _load_batch(blobs: list[bytes]) -> list[Any]:
    return [loads(b) for b in blobs]


def batch_result(blobs: list[bytes]) -> bytes:
    """The result of a batch: unpickles to the list of its children's results, in order.

    The children's pickles are nested as they are, so the parent never has to
    unpickle (or be able to import) the children's result types.
    """
    return dumps(_BatchResult(blobs))


# -- exceptions ---------------------------------------------------------------
#
# A stored exception is a chain of links, outermost first, each pickled as
#
#     _unbox_exception(<the exception's own pickle>, "module.Type", str(exc), <its cause>)
#
# The exception's own pickle is nested as bytes, so that when it cannot be
# loaded here (a class this process cannot import, an ``__init__`` that
# wants other arguments than it was pickled with) only that link fails, and
# becomes a RemoteError built from the two strings beside it; its cause, the
# child's RemoteTraceback, still loads. The traceback is stored as its text,
# so tools can read it with pickletools without unpickling anything.
#
# Blobs written before (``_rebuild_exception(exc, cause)``) still load; when
# they fail, the type and message are read from the traceback text inside.


def _rebuild_exception(exc: BaseException, cause: BaseException | None) -> BaseException:
    # The format of blobs stored by dbexecutor 0.1.0: keep it loadable.
    exc.__cause__ = cause
    return exc


def exception_type_name(exc: BaseException) -> str:
    """``module.QualName`` of an exception's type."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as error:  # a broken __str__ must not lose the exception itself
        return f"<str() failed: {type(error).__name__}: {error}>"


def exception_summary(exc: BaseException) -> str:
    """``Type: message`` for a row's readable ``error`` column, even when ``str(exc)`` raises."""
    return f"{type(exc).__name__}: {_message(exc)}"


def _unbox_exception(
    pickled: bytes, type_name: str, message: str, cause: BaseException | None
) -> BaseException:
    """Load one link of a stored exception chain (named in stored blobs: keep the name)."""
    exc: BaseException
    try:
        loaded = loads(pickled)
        if not isinstance(loaded, BaseException):
            raise TypeError(f"the stored exception is a {type(loaded).__name__}")
        exc = loaded
    except Exception as error:
        exc = _remote_error(type_name, message, error)
    exc.__cause__ = cause
    return exc


def _remote_error(type_name: str, message: str, error: BaseException) -> RemoteError:
    reason = f"{type(error).__name__}: {error}"
    remote = RemoteError(type_name, message, reason)
    if hasattr(remote, "add_note"):  # 3.11+: the traceback says why it is not the original type
        remote.add_note(f"({type_name} could not be rebuilt in this process: {reason})")
    return remote


class _ExceptionBox:
    """Pickles an exception with its ``__cause__`` chain, one link at a time (see above)."""

    def __init__(self, exc: BaseException, depth: int = 0) -> None:
        self.exc = exc
        cause = exc.__cause__
        self.cause = _ExceptionBox(cause, depth + 1) if cause is not None and depth < _MAX_CAUSE_DEPTH else None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        exc = self.exc
        if type(exc) is RemoteTraceback and self.cause is None:
            return (RemoteTraceback, (exc.tb,))  # plain text: always loadable, readable by tools
        # Raises if the exception cannot be pickled: dump_exception stores a replacement.
        pickled = dumps(exc)
        return (_unbox_exception, (pickled, exception_type_name(exc), _message(exc), self.cause))


def format_remote_traceback(exc: BaseException) -> str:
    """The child's traceback, framed like ``ProcessPoolExecutor``'s remote traceback."""
    return '\n"""\n' + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + '"""'


def dump_exception(exc: BaseException, *, remote_tb: str | None = None, signer: Signer = UNSIGNED) -> bytes:
    """Pickle an exception with its cause chain; ``remote_tb`` becomes the innermost cause.

    Each exception is stored with its type's qualified name and its message,
    so a process that cannot rebuild it still raises a :class:`RemoteError`
    saying what it was. If the exception itself cannot be pickled, the
    pickling error is stored in its place, with the original's type and
    message, as ``ProcessPoolExecutor`` does. The signature covers all of it.
    """
    if remote_tb is not None:
        exc.__cause__ = RemoteTraceback(remote_tb)
    try:
        return signer.sign(dumps(_ExceptionBox(exc)), ERROR_CONTEXT)
    except Exception as pickling_error:
        replacement = pickle.PicklingError(
            f"exception {exception_type_name(exc)}({_message(exc)}) could not be pickled: {pickling_error}"
        )
        if remote_tb is not None:
            replacement.__cause__ = RemoteTraceback(remote_tb)
        return signer.sign(dumps(_ExceptionBox(replacement)), ERROR_CONTEXT)


def load_exception(data: bytes, signer: Signer = UNSIGNED) -> BaseException:
    """Inverse of :func:`dump_exception`; never raises.

    An exception that cannot be rebuilt here comes back as a
    :class:`RemoteError` (type name, message, the child's traceback as
    ``__cause__``); a blob that fails its signature as ``PayloadRejected``.
    """
    try:
        data = signer.open(data, ERROR_CONTEXT, "a stored exception")
    except PayloadRejected as rejected:
        return rejected
    try:
        exc = loads(data)
    except Exception as error:  # a blob of the old format whose exception cannot be rebuilt here
        return _salvage(data, error)
    if not isinstance(exc, BaseException):
        return TypeError(f"stored exception blob holds {type(exc).__name__}, not an exception")
    return exc


_TRACEBACK_HEAD = "Traceback (most recent call last):"


def find_traceback(data: bytes) -> str | None:
    """The child's formatted traceback inside an (unsigned) exception pickle, found without unpickling it."""
    best: str | None = None
    try:
        for _op, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str) and _TRACEBACK_HEAD in arg and (best is None or len(arg) > len(best)):
                best = arg
    except Exception:
        pass  # truncated or altered: keep what was read
    return best


def _last_exception_line(tb: str) -> tuple[str, str] | None:
    """``(type, message)`` of the exception a formatted traceback ends with."""
    lines = tb.strip().strip('"').strip().splitlines()
    heads = [n for n, line in enumerate(lines) if line.startswith(_TRACEBACK_HEAD)]
    if not heads:
        return None
    # After the last "Traceback" header: indented frame lines, then "Type: message" (maybe on several lines).
    rest = lines[heads[-1] + 1 :]
    while rest and (not rest[0] or rest[0][0].isspace()):
        rest.pop(0)
    if not rest:
        return None
    type_name, _, first = rest[0].partition(": ")
    return type_name, "\n".join([first, *rest[1:]]).strip()


def _salvage(data: bytes, error: BaseException) -> BaseException:
    """The best account of an exception pickle that could not be loaded: what its traceback says."""
    tb = find_traceback(data)
    found = _last_exception_line(tb) if tb is not None else None
    if tb is None or found is None:
        return _remote_error("<unknown>", f"the stored exception could not be unpickled: {error!r}", error)
    remote = _remote_error(found[0], found[1], error)
    remote.__cause__ = RemoteTraceback(tb)
    return remote


def dependency_failure(upstream_id: int, upstream_blob: bytes | None, signer: Signer = UNSIGNED) -> bytes:
    """The stored error of a job whose upstream ``upstream_id`` failed.

    The cause is the root failure's exception (not a chain of intermediate
    ``DependencyFailed``), so the blob stays small however long the chain is.
    """
    upstream = load_exception(upstream_blob, signer) if upstream_blob else RuntimeError(f"job {upstream_id} failed")
    if isinstance(upstream, DependencyFailed):
        root_id = upstream.root_job_id
        cause = upstream.__cause__
    else:
        root_id, cause = upstream_id, upstream
    if root_id == upstream_id:
        message = f"upstream job {upstream_id} failed: {type(cause).__name__}: {cause}"
    else:
        message = f"upstream job {upstream_id} failed because job {root_id} failed: {type(cause).__name__}: {cause}"
    error = DependencyFailed(upstream_id, message, root_job_id=root_id)
    error.__cause__ = cause
    return signer.sign(dumps(_ExceptionBox(error)), ERROR_CONTEXT)
