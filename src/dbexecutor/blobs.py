"""Reading stored pickles without running them: what a payload calls and holds, a failed job's traceback.

``pickletools`` parses a pickle without executing it, so the command line
and the web UI can show a job's arguments and its child's traceback from
the rows alone, with nothing imported or unpickled. No database code here.
"""

from __future__ import annotations

import pickletools
from typing import Any

from . import serialization

__all__ = ["pickle_summary", "stored_traceback", "short"]


def short(text: Any, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis ("-" for None)."""
    s = "-" if text is None else " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


# What a pickle made by value (serialization.ByValue, byvalue.FunctionByValue) loads itself with,
# or a function stored by value is named with (byvalue.StoredFunction).
_BY_VALUE_LOADERS = (
    "dbexecutor.serialization.ByValue", "dbexecutor.byvalue.load_function", "dbexecutor.byvalue.load_stored",
)


def pickle_summary(blob: bytes | None, max_items: int = 12) -> dict[str, Any]:
    """What a stored pickle refers to and holds, read with ``pickletools`` (nothing is executed).

    ``globals``: the importable names it would load (the function, classes);
    ``values``: its first literal strings and numbers; ``signed``: whether it
    carries a signature.
    """
    if blob is None:
        return {"size": 0, "signed": False, "globals": [], "values": []}
    data, signed = serialization.strip_signature(bytes(blob))
    names: list[str] = []
    values: list[Any] = []
    strings: list[str] = []
    in_by_value = False  # between a by-value loader and its pickle (or name): the Python version and those are not arguments
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name == "GLOBAL" or op.name == "INST":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
                in_by_value = names[-1] in _BY_VALUE_LOADERS
            elif in_by_value and isinstance(arg, (int, bytes, str)):
                in_by_value = isinstance(arg, int)  # the Python version; then the pickle, or its stored name
            elif isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
                values.append(arg)
            elif isinstance(arg, (int, float, bytes)) and ("INT" in op.name or "FLOAT" in op.name or "BYTES" in op.name):
                if op.name not in ("PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"):
                    values.append(arg)
        error = None
    except Exception as exc:  # a truncated or altered pickle: say so, keep what was read
        error = f"{type(exc).__name__}: {exc}"
    # The function and argument classes are referenced by name; their own names are not arguments.
    named = {part for n in names for part in n.rsplit(".", 1)} | {n.rsplit(".", 1)[0] for n in names}
    literal = [v for v in values if not (isinstance(v, str) and v in named)]
    out: dict[str, Any] = {
        "size": len(bytes(blob)),
        "signed": signed,
        "globals": list(dict.fromkeys(names))[:max_items],
        "values": [short(v, 60) if isinstance(v, str) else v for v in literal[:max_items]],
    }
    if error:
        out["unreadable"] = error
    return out


def stored_traceback(blob: bytes | None) -> str | None:
    """The child's formatted traceback inside a stored exception, found without unpickling it."""
    if not blob:
        return None
    data, _ = serialization.strip_signature(bytes(blob))
    best: str | None = None
    try:
        for _op, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str) and "Traceback (most recent call last)" in arg:
                if best is None or len(arg) > len(best):
                    best = arg
    except Exception:
        pass
    return best.strip().strip('"').strip() if best else None
