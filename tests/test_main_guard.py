"""A script that starts an executor when imported, without ``if __name__ == "__main__":``.

Children started by ``forkserver`` or ``spawn`` import the parent's main
module first. Such a script then starts an executor in each child, as it
would a ``ProcessPoolExecutor`` under those start methods. Here that must end
quickly and say why: the child's executor refuses to start (``RuntimeError``
naming the guard), and the job fails with ``WorkerDied`` saying the child
never got to run it. Before, the child's executor started a scheduler that
died on multiprocessing's own error, logged as "see the log", and the job
failed with a bare exit code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from clitools import TESTS_DIR, cli_env

_SCRIPT = textwrap.dedent(
    """
    import sys
    from dbexecutor import DBExecutor, WorkerDied

    def double(x):
        return 2 * x

    print("imported as", __name__, flush=True)
    with DBExecutor(sys.argv[1], max_workers=1, prefix=sys.argv[2]) as ex:
        try:
            print("result", ex.submit(double, 21).result(timeout=60), flush=True)
        except WorkerDied as died:
            print("died", died, flush=True)
    """
)


def test_an_unguarded_script_fails_its_job_and_says_why(db, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), db.url, db.prefix], capture_output=True, text=True, env=cli_env(),
        cwd=TESTS_DIR, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "imported as __main__" in lines and "imported as __mp_main__" in lines, out.stdout
    (died,) = [line for line in lines if line.startswith("died ")]
    assert "before it could run a job" in died and 'if __name__ == "__main__":' in died, died
    assert "RuntimeError: a DBExecutor was created while this child process was importing the main module" in out.stderr
    # The child's executor stopped before it touched the database: one job, the parent's.
    assert [row.fn_name.rsplit(".", 1)[-1] for row in db.jobs()] == ["double"]
    assert db.jobs()[0].state == "failed"
