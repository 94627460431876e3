"""The fork server starts early and preloads the child's code, so a new child runs its first job at once.

Not per database: this is about processes, before any connection. Each case
runs in a fresh interpreter, since a process has one fork server, started
once (the test process's own may be running already, without the preload).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from clitools import TESTS_DIR, cli_env

_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, sys
    import forkprobe

    if __name__ == "__main__":
        # Imported here: the fork server preloads this script's top level.
        from dbexecutor.pool import warm_up

        ctx = multiprocessing.get_context("forkserver")
        if sys.argv[1] == "warm":
            warm_up(ctx)
        queue = ctx.Queue()
        process = ctx.Process(target=forkprobe.loaded, args=(queue,))
        process.start()
        print(json.dumps(queue.get(timeout=60)))
        process.join(60)
    """
)


def _child_modules(mode: str, tmp_path: object) -> dict[str, bool]:
    script = f"{tmp_path}/probe_main.py"
    with open(script, "w") as f:
        f.write(_SCRIPT)
    out = subprocess.run([sys.executable, script, mode], capture_output=True, text=True, env=cli_env(),
                         cwd=TESTS_DIR, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_child_forked_after_warm_up_has_the_childs_code_and_no_database_code(tmp_path):
    assert _child_modules("warm", tmp_path) == {"dbexecutor.child": True, "sqlalchemy": False}


def test_without_warm_up_a_child_imports_the_childs_code_itself(tmp_path):
    # The control: the probe imports nothing of dbexecutor, so only the preload puts it there.
    assert _child_modules("cold", tmp_path) == {"dbexecutor.child": False, "sqlalchemy": False}
