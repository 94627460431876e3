"""A/B: the same benchmarks on two revisions of dbexecutor, run side by side, alternating.

::

    python benchmarks/ab.py HEAD~1 HEAD --scenarios throughput --databases sqlite --quick --rounds 4
    python benchmarks/ab.py main bench --scenarios throughput,map,latency --rounds 6 --json ab.json
    python benchmarks/ab.py A B --set jobs=2000 --no-baselines loky,pebble   # other options go to run.py

Each revision is checked out into a git worktree of its own in a temporary
directory (removed afterwards; ``--keep`` leaves them). The benchmark code is
this checkout's ``benchmarks/`` for both sides; only the library differs: each
run is ``python -m benchmarks ...`` in a fresh interpreter (this one's
virtualenv) with ``PYTHONPATH=<worktree>/src``, and the run's own JSON says
which ``dbexecutor`` it imported, which is checked. Runs go A, B, A, B, ...
for ``--rounds`` rounds, so that drift of the machine falls on both. The table
gives, per metric, the median of A's runs, of B's, and B / A (for rates higher
is better, for times lower); the JSON keeps every run's value and rows.

The machine's speed drifts even between rounds a minute apart, and a short
cell (map with chunksize 64 takes ~25 ms) moves with it. Where a metric has
a ratio to a baseline timed interleaved within the same run (PPE, a plain
INSERT+COMMIT loop; the row's ``ratio_of`` says which), the table also gives
``B / A (÷ base)``: the median of B's per-run ratios over A's. The baseline's
pace then cancels out, and that column is the one to trust. ``p`` says
whether the two sides differ beyond the runs' own spread: an exact
Mann-Whitney test of those per-run ratios (of the values where a metric has
no baseline), the share of all ways to deal the pooled runs into two sides
of these sizes that look at least as lopsided by rank. With 5 + 5 runs the
smallest possible is 0.008, with 3 + 3 it is 0.1: above 0.05, the difference
is noise as far as these runs can tell.

Options it does not know (``--quick``, ``--set``, ``--workers``, ``--no-baselines``) are
passed on to ``benchmarks/run.py``. Both revisions must import with the packages
installed in this interpreter.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from collections.abc import Iterable
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


def _checkout(rev: str, where: Path) -> str:
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    _git("worktree", "add", "--detach", str(where), sha)
    if not (where / "src" / "dbexecutor" / "__init__.py").exists():
        raise SystemExit(f"{rev} ({sha[:10]}) has no src/dbexecutor")
    return sha


def _remove(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


def _run(side: str, src: Path, passthrough: list[str], out: Path, log: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with open(log, "w") as f:
        code = subprocess.run([sys.executable, "-m", "benchmarks", *passthrough, "--json", str(out)], env=env,
                              cwd=str(ROOT), stdout=f, stderr=subprocess.STDOUT).returncode
    if not out.exists():
        raise SystemExit(f"side {side}: the run wrote no JSON (exit {code}); see {log}")
    with open(out) as f:
        data = json.load(f)
    used = Path(data["machine"].get("dbexecutor_path", "")).resolve()
    if src.resolve() not in used.parents:
        raise SystemExit(f"side {side}: the run imported dbexecutor from {used}, not from {src}")
    data["exit_code"] = code
    return data


def permutation_p(a: list[float], b: list[float], limit: int = 20_000) -> float | None:
    """Two-sided exact Mann-Whitney test: the share of splits of the pooled runs whose rank sum strays as far.

    Every split of the pooled values into sides of these sizes is tried (or
    ``limit`` random ones): ranks, not values, so one wild run cannot decide.
    """
    if len(a) < 2 or len(b) < 2:
        return None
    pooled = sorted(a + b)
    # Mid-ranks for ties.
    rank = {v: (pooled.index(v) + len(pooled) - pooled[::-1].index(v) + 1) / 2 for v in pooled}
    ranks = [rank[v] for v in a + b]
    expected = len(a) * (len(pooled) + 1) / 2
    observed = abs(sum(ranks[: len(a)]) - expected)
    if math.comb(len(ranks), len(a)) <= limit:
        splits: Iterable[tuple[float, ...]] = itertools.combinations(ranks, len(a))
    else:
        rng = random.Random(0)
        splits = (tuple(rng.sample(ranks, len(a))) for _ in range(limit))
    total = hits = 0
    for side in splits:
        total += 1
        hits += abs(sum(side) - expected) >= observed - 1e-9
    return hits / total


def _key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["scenario"], row["database"], row["metric"]


def _fmt(value: float | None, unit: str) -> str:
    from benchmarks.run import fmt

    return fmt(value, unit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/ab.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="revision A (the reference), e.g. HEAD~1 or main")
    parser.add_argument("b", help="revision B, e.g. HEAD")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating (default 3)")
    parser.add_argument("--scenarios", default="throughput", help="as run.py's --scenarios (default throughput)")
    parser.add_argument("--databases", default="sqlite,postgresql,mariadb")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "ab.json"))
    parser.add_argument("--keep", action="store_true", help="leave the worktrees and the per-run JSON and logs")
    args, passthrough = parser.parse_known_args(argv)
    passthrough = ["--scenarios", args.scenarios, "--databases", args.databases, *passthrough]

    if __package__ in (None, ""):
        sys.path[0:1] = [str(ROOT)]
    tmp = Path(tempfile.mkdtemp(prefix="dbexecutor-ab-"))
    sides = {"A": (args.a, tmp / "a"), "B": (args.b, tmp / "b")}
    shas: dict[str, str] = {}
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        for side, (rev, where) in sides.items():
            shas[side] = _checkout(rev, where)
            print(f"{side}: {rev} = {shas[side][:10]}  ({_git('log', '-1', '--format=%s', shas[side])[:70]})", flush=True)
        for r in range(args.rounds):
            for side in ("A", "B"):
                rev, where = sides[side]
                out, log = tmp / f"{side}-{r}.json", tmp / f"{side}-{r}.log"
                print(f"round {r + 1}/{args.rounds}: {side} ({rev}) ...", end=" ", flush=True)
                data = _run(side, where / "src", passthrough, out, log)
                runs[side].append(data)
                errors = data.get("errors") or []
                print(f"{data['seconds']['total']:.0f} s" + (f", {len(errors)} scenario(s) failed" if errors else ""),
                      flush=True)
                for e in errors:
                    print(f"    {e['scenario']}/{e['database']}: {e['error']}", flush=True)
    finally:
        for _, where in sides.values():
            if not args.keep:
                _remove(where)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")

    # Per metric: every run's dbexecutor value on each side.
    order: list[tuple[str, str, str]] = []
    values: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    # Each run's ratio to its baseline, measured interleaved within that run.
    shares: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    units: dict[tuple[str, str, str], str] = {}
    for side in ("A", "B"):
        for data in runs[side]:
            for row in data["results"]:
                k = _key(row)
                if k not in values:
                    order.append(k)
                    values[k] = {"A": [], "B": []}
                    shares[k] = {"A": [], "B": []}
                units[k] = row["unit"]
                if row["dbexecutor"] is not None:
                    values[k][side].append(row["dbexecutor"])
                if row.get("ratio") is not None:
                    shares[k][side].append(row["ratio"])
    table = [["scenario", "database", "metric", "A median", "B median", "B / A", "B / A (÷ base)", "p", "better", "runs"]]
    summary = []
    for k in order:
        a, b = values[k]["A"], values[k]["B"]
        ma = statistics.median(a) if a else None
        mb = statistics.median(b) if b else None
        ratio = None if ma in (None, 0) or mb is None else mb / ma
        sa, sb = shares[k]["A"], shares[k]["B"]
        normed = statistics.median(sb) / statistics.median(sa) if sa and sb and statistics.median(sa) else None
        p = permutation_p(sa, sb) if normed is not None else permutation_p(a, b)
        unit = units[k]
        better = "higher" if unit == "/s" else ("lower" if unit in ("s", "ms", "MB", "B") else "")
        summary.append({"scenario": k[0], "database": k[1], "metric": k[2], "unit": unit, "a": a, "b": b,
                        "a_median": ma, "b_median": mb, "b_over_a": ratio, "a_base_ratios": sa, "b_base_ratios": sb,
                        "b_over_a_vs_base": normed, "p": p, "better": better})
        table.append([k[0], k[1], k[2], _fmt(ma, unit), _fmt(mb, unit), "—" if ratio is None else f"{ratio:.3f}",
                      "—" if normed is None else f"{normed:.3f}",
                      "—" if p is None else f"{p:.3f}", better, f"{len(a)}+{len(b)}"])
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print()
    print(f"A = {args.a} ({shas['A'][:10]}), B = {args.b} ({shas['B'][:10]}), {args.rounds} round(s), alternating A, B")
    print("\n".join(lines))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"started": started, "a": {"rev": args.a, "sha": shas["A"]}, "b": {"rev": args.b, "sha": shas["B"]},
                   "rounds": args.rounds, "passthrough": passthrough, "summary": summary, "runs": runs}, f, indent=2,
                  default=str)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
