"""Functions of the program's ``__main__``: pickled by value once, reused while what they captured holds.

The unit tests build their functions with ``exec`` in a namespace named
``__main__`` (what a script's top level is), so that pickling them by
reference fails as it does for a script's own functions; the end-to-end
tests run a real script as a subprocess, on each database.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from clitools import cli_env
from dbexecutor import blobs, byvalue, serialization
from dbexecutor.child import run_chunk
from dbexecutor.errors import CannotRunHere


def _program(source: str) -> dict[str, Any]:
    """The namespace of a program whose top level is ``source`` (its functions' module is ``__main__``)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(textwrap.dedent(source), namespace)  # noqa: S102 - the test's own source
    return namespace


def _run(payload: bytes) -> Any:
    fn, args, kwargs = serialization.load_payload(payload)
    return fn(*args, **kwargs)


def test_the_same_function_is_pickled_once_and_each_payload_runs_it():
    ns = _program("""
        import math
        def helper(x):
            return x + 1
        def job(x, *, scale=2):
            return math.floor(helper(x) * scale)
    """)
    first = byvalue.embedded(ns["job"])
    assert first is not None
    assert byvalue.embedded(ns["job"]) is first  # not pickled again
    payloads = [serialization.dump_payload(ns["job"], (i,), {}) for i in range(3)]
    assert all(first.data in p for p in payloads)
    assert [_run(p) for p in payloads] == [2, 4, 6]


def test_a_global_reassigned_between_submits_is_pickled_anew():
    ns = _program("""
        FACTOR = 3
        def job(x):
            return x * FACTOR
    """)
    before = serialization.dump_payload(ns["job"], (2,), {})
    ns["FACTOR"] = 5
    after = serialization.dump_payload(ns["job"], (2,), {})
    assert (_run(before), _run(after)) == (6, 10)


def test_a_name_defined_after_the_first_pickle_is_seen():
    ns = _program("""
        def job():
            return LATER
    """)
    with pytest.raises(NameError):
        _run(serialization.dump_payload(ns["job"], (), {}))
    ns["LATER"] = "here now"
    assert _run(serialization.dump_payload(ns["job"], (), {})) == "here now"


def test_a_helper_redefined_between_submits_is_pickled_anew():
    ns = _program("""
        def helper():
            return "old"
        def job():
            return helper()
    """)
    before = serialization.dump_payload(ns["job"], (), {})
    exec("def helper():\n    return 'new'\n", ns)  # noqa: S102
    assert (_run(before), _run(serialization.dump_payload(ns["job"], (), {}))) == ("old", "new")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(lambda ns: ns["job"].__kwdefaults__.update(scale=10), 10, id="keyword-default-in-place"),
        pytest.param(lambda ns: setattr(ns["job"], "__defaults__", (10,)), 10, id="defaults"),
        pytest.param(lambda ns: setattr(ns["job"], "__code__", ns["other"].__code__), -1, id="code"),
    ],
)
def test_a_change_to_the_function_itself_is_pickled_anew(change, expected):
    ns = _program("""
        def job(x=1, *, scale=1):
            return x * scale
        def other(x=1, *, scale=1):
            return -x * scale
    """)
    before = serialization.dump_payload(ns["job"], (), {})
    change(ns)
    assert (_run(before), _run(serialization.dump_payload(ns["job"], (), {}))) == (1, expected)


def test_a_changed_closure_cell_is_pickled_anew():
    ns = _program("""
        def make():
            value = "first"
            def job():
                return value
            def change(new):
                nonlocal value
                value = new
            return job, change
        job, change = make()
    """)
    before = serialization.dump_payload(ns["job"], (), {})
    ns["change"]("second")
    assert (_run(before), _run(serialization.dump_payload(ns["job"], (), {}))) == ("first", "second")


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("SEEN = []\ndef job():\n    return list(SEEN)\n", id="a-list-global"),
        pytest.param("class Box:\n    value = 1\ndef job():\n    return Box.value\n", id="a-class-of-the-program"),
        pytest.param("def job():\n    return job.calls\njob.calls = 0\n", id="a-function-attribute"),
        pytest.param("def job(seen=[]):\n    return list(seen)\n", id="a-mutable-default"),
    ],
)
def test_a_function_that_captures_what_can_change_in_place_is_pickled_each_time(source):
    ns = _program(source)
    assert byvalue.embedded(ns["job"]) is None
    payload = serialization.dump_payload(ns["job"], (), {})
    assert _run(payload) in ([], 1, 0)


def test_a_mutable_global_changed_in_place_is_seen_by_the_next_payload():
    ns = _program("""
        SEEN = []
        def job():
            return list(SEEN)
    """)
    before = serialization.dump_payload(ns["job"], (), {})
    ns["SEEN"].append("x")
    assert (_run(before), _run(serialization.dump_payload(ns["job"], (), {}))) == ([], ["x"])


def test_arguments_that_refer_to_main_send_the_whole_call_by_value():
    ns = _program("""
        class Point:
            def __init__(self, x):
                self.x = x
        def job(p, f):
            return f(p.x)
        def echo(x):
            return x
    """)
    payload = serialization.dump_payload(ns["job"], (ns["Point"](4),), {"f": lambda v: v * 10})
    assert type(pickle.loads(payload)) is serialization.ByValue
    assert _run(payload) == 40
    # An argument that only holds the text __main__: the call goes by value too (the search cannot tell), and runs.
    text = serialization.dump_payload(ns["echo"], ("__main__",), {})
    assert type(pickle.loads(text)) is serialization.ByValue and _run(text) == "__main__"
    plain = serialization.dump_payload(ns["job"], (), {})
    assert type(pickle.loads(plain)) is tuple


def test_a_function_of_the_program_passed_as_an_argument_is_embedded_too():
    """As ``map`` passes it to each chunk's job (``run_chunk(fn, chunk)``); a callback argument alike."""
    ns = _program("""
        def square(x):
            return x * x
        def call(f, *args, **kwargs):
            return f(*args, **kwargs)
        SEEN = []
        def remembers(x):
            SEEN.append(x)
            return len(SEEN)
    """)
    chunk = serialization.dump_payload(run_chunk, (ns["square"], [(2,), (3,)]), {})
    assert type(pickle.loads(chunk)) is tuple  # not the whole call by value
    assert byvalue.embedded(ns["square"]).data in chunk
    assert _run(chunk) == [4, 9]
    # The same function called and passed as an argument: its pickle goes in once.
    twice = serialization.dump_payload(ns["call"], (ns["call"], ns["square"]), {"x": 4})
    assert twice.count(byvalue.embedded(ns["call"]).data) == 1 and type(pickle.loads(twice)) is tuple
    assert _run(twice) == 16
    # A function that captures a list goes by value with the whole call, each time.
    whole = serialization.dump_payload(run_chunk, (ns["remembers"], [(1,), (2,)]), {})
    assert type(pickle.loads(whole)) is serialization.ByValue
    assert _run(whole) == [1, 2]


def test_a_loaded_function_is_loaded_once_and_keeps_its_globals_between_calls():
    ns = _program("""
        CALLS = 0
        def job():
            global CALLS
            CALLS += 1
            return CALLS
    """)
    payload = serialization.dump_payload(ns["job"], (), {})
    # Each load is a fresh unpickling of the payload, as in a child; the function inside is rebuilt once.
    assert [_run(payload) for _ in range(3)] == [1, 2, 3]
    ns["CALLS"] = 10  # the program's own value changed: a new pickle, a new function
    assert _run(serialization.dump_payload(ns["job"], (), {})) == 11


def test_a_function_pickled_by_value_on_another_python_cannot_run_here():
    other = (sys.version_info[0], sys.version_info[1] + 1)
    data = pickle.dumps(byvalue.FunctionByValue(other, b"irrelevant"))
    with pytest.raises(CannotRunHere, match="pickled by value on Python"):
        pickle.loads(data)


def test_the_summary_of_a_payload_shows_the_arguments_not_the_functions_pickle():
    ns = _program("""
        def job(word, n):
            return word * n
    """)
    summary = blobs.pickle_summary(serialization.dump_payload(ns["job"], ("hello", 7), {}))
    assert summary["values"] == ["hello", 7]
    assert summary["globals"] == ["dbexecutor.byvalue.load_function"]


# A script as users write them: its job function lives in its own __main__.
SCRIPT = """
import json, sys
from dbexecutor import DBExecutor

CALLS = 0
BONUS = 0

def count():
    global CALLS
    CALLS += 1
    return CALLS + BONUS

if __name__ == "__main__":
    url, options = sys.argv[1], json.loads(sys.argv[2])
    with DBExecutor(url, 1, **options) as ex:
        results = [ex.submit(count).result(timeout=60) for _ in range(3)]
        BONUS = 100
        results += [ex.submit(count).result(timeout=60) for _ in range(2)]
    print(json.dumps(results), flush=True)
"""


def test_a_scripts_function_keeps_its_globals_in_a_child_and_sees_the_scripts_new_values(db, tmp_path):
    """As in a ``ProcessPoolExecutor``'s worker, the child's copy of the function keeps what earlier jobs set;
    a global the script reassigns reaches the jobs submitted after it."""
    path = tmp_path / "counting.py"
    path.write_text(SCRIPT)
    got = subprocess.run(
        [sys.executable, str(path), db.url, json.dumps(db.options)],
        capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=120,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    # One child: 1, 2, 3; then a new pickle (BONUS changed) whose function starts from the script's CALLS (0).
    assert json.loads(got.stdout) == [1, 2, 3, 101, 102]
    assert {row.state for row in db.jobs()} == {"done"}
