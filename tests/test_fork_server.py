"""The fork server loads the program's main script once; the children it forks do not import it again.

Python 3.4–3.13.7 never hand the script's path to the fork server, so its
``"__main__"`` preload did nothing and every child ran the script's top
level (its imports, SQLAlchemy among them) before its first job
(``dbexecutor.forkmain``). The scripts here are real scripts run as
subprocesses, as users run theirs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from clitools import cli_env
from dbexecutor import forkmain, pool

T = 120

# Its top level appends "pid name" to the file named by its third argument, and
# imports a module that sits beside it (so it needs the script's sys.argv and sys.path).
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import beside
    with open(sys.argv[3], "a") as f:
        f.write(f"{os.getpid()} {__name__}\\n")
    from dbexecutor import DBExecutor

    def where(x):
        return os.getpid(), beside.VALUE + x

    if __name__ == "__main__":
        with DBExecutor(sys.argv[1], 2, **json.loads(sys.argv[2])) as ex:
            print(json.dumps(list(ex.map(where, range(12)))), flush=True)
""")


def test_children_do_not_run_the_scripts_top_level_again(db, tmp_path):
    (tmp_path / "beside.py").write_text("VALUE = 100\n")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    runs = tmp_path / "runs.txt"
    out = subprocess.run(
        [sys.executable, str(script), db.url, json.dumps(db.options), str(runs)],
        capture_output=True, text=True, env=cli_env(), cwd=tmp_path, timeout=T,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    assert [value for _, value in results] == [100 + x for x in range(12)]
    children = {pid for pid, _ in results}
    ran = [line.split() for line in runs.read_text().splitlines()]
    # The script itself, then the fork server (as __mp_main__); never a child.
    assert [name for _, name in ran] == ["__main__", "__mp_main__"], ran
    assert not children & {int(pid) for pid, _ in ran}, (children, ran)


def test_the_preload_is_named_by_one_variable_on_both_sides():
    # pool cannot import forkmain for the name: importing it runs the preload.
    assert pool.FORKSERVER_MAIN_ENV == forkmain.ENV
