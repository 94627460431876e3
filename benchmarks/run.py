"""Benchmarks: dbexecutor against ProcessPoolExecutor on the same workload, same run.

    python -m benchmarks                          # every scenario, every database, default sizes
    python -m benchmarks --quick                  # scaled down: all three databases in under a minute
    python benchmarks/run.py --databases sqlite --scenarios throughput,map --set jobs=2000
    python -m benchmarks --json out.json          # default: benchmarks/results/latest.json (quick.json with --quick)
    python -m benchmarks --show benchmarks/results/latest.json   # the table of an earlier run

Scenarios: throughput, map, efficiency, dag, claim, latency, memory (benchmarks/scenarios.py);
durable, coldstart, roundtrip, timeout (benchmarks/perjob.py); drain, scaleout, swarm, idle,
connections (benchmarks/scaleout.py); benchmarks/catalog.py lists them. Where a baseline
applies, ProcessPoolExecutor (and loky, pebble when importable) is alive at the same time
as dbexecutor and timed in turn, interleaved; the ratios are what to compare across
machines, absolute numbers depend on the box. Prints a table and writes JSON with every
raw number and the machine. To compare two commits side by side: benchmarks/ab.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/run.py: make "benchmarks" a package children can import
    sys.path[0:1] = [str(ROOT)]
try:
    import dbexecutor
except ImportError:  # a checkout without the package installed
    sys.path.insert(1, str(ROOT / "src"))
    import dbexecutor

import psutil  # noqa: E402
import sqlalchemy  # noqa: E402

from benchmarks import baselines  # noqa: E402
from benchmarks.catalog import SCENARIOS  # noqa: E402
from benchmarks.scenarios import URLS, Context, Row, Sizes  # noqa: E402

DEFAULT_JSON = ROOT / "benchmarks" / "results" / "latest.json"
ALIASES = {"mysql": "mariadb", "pg": "postgresql", "postgres": "postgresql"}


# -- machine --------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _server_version(kind: str) -> str | None:
    if kind == "sqlite":
        return sqlite3.sqlite_version
    from dbexecutor.dialects import resolve

    try:
        engine = sqlalchemy.create_engine(resolve(URLS[kind]).url)
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SELECT version()").scalar()
        engine.dispose()
        return str(version)
    except Exception as error:  # noqa: BLE001
        return f"unreachable: {type(error).__name__}"


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except ImportError:
        return None
    return str(getattr(module, "__version__", getattr(module, "VERSION", "?")))


def _git_commit(where: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def _library_dir() -> Path:
    """Where the imported dbexecutor lives (benchmarks/ab.py points PYTHONPATH at another revision's src)."""
    return Path(dbexecutor.__file__).resolve().parent


def compile_bytecode() -> str:
    """Compile dbexecutor's and the benchmarks' modules to ``__pycache__`` before anything is timed.

    An installed package has its bytecode (pip compiles it at install); a
    source tree in a virtualenv made with ``PYTHONDONTWRITEBYTECODE=1`` set
    has none, and every fresh process then compiled dbexecutor's modules
    again: about 0.09 s of each cold start and worker start, which
    ``ProcessPoolExecutor``'s standard library never pays. ``compileall``
    writes the files whatever that variable says; processes only read them.
    """
    import compileall

    ok = all(compileall.compile_dir(str(d), quiet=1) for d in (_library_dir(), Path(__file__).resolve().parent))
    return "compiled before the run" if ok else "compiling failed: modules may be compiled by each process"


def machine(databases: list[str]) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": _module_version("psycopg"),
        "pymysql": _module_version("pymysql"),
        **baselines.versions(),
        "servers": {kind: _server_version(kind) for kind in databases},
        "dbexecutor_commit": _git_commit(_library_dir()),
        "dbexecutor_path": str(_library_dir()),
        "benchmarks_commit": _git_commit(),
        "bytecode": compile_bytecode(),
        "load_average_at_start": list(os.getloadavg()),
    }


# -- table ----------------------------------------------------------------------


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "":
        return f"{value:g}"
    if unit == "MB":
        return f"{value:.2f} MB"
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:.2f} {unit}"


def table(rows: list[Row], names: list[str]) -> str:
    """A Markdown table: one row per metric of each scenario on each database.

    A column per baseline executor, then one per other reference a scenario
    measured (the plain INSERT+COMMIT rate, PGQueuer, 1 executor x 20 slots...).
    """
    names = list(dict.fromkeys([*names, *(k for r in rows for k in r.baselines)]))
    head = ["scenario", "database", "metric", "dbexecutor", *[n if n != "ppe" else "PPE" for n in names],
            "ratio", "target", "pass"]
    lines = [head]
    for r in rows:
        ratio = "—" if r.ratio is None else (f"{r.ratio:.1%}" if r.unit == "/s" else f"{r.ratio:.2f}x")
        verdict = "" if r.passed is None else ("yes" if r.passed else "**no**")
        lines.append([r.scenario, r.database, r.metric, fmt(r.dbexecutor, r.unit),
                      *[fmt(r.baselines.get(n), r.unit) for n in names], ratio, r.target, verdict])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


# -- main -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--databases", default="sqlite,postgresql,mariadb")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"any of {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help="scaled-down sizes (a smoke run, not a measurement)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, help="jobs for throughput and map (same as --set jobs=N)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one size, e.g. --set memory_jobs=20000 --set claim_finished=0,10000; "
                        f"names: {', '.join(f.name for f in dataclasses.fields(Sizes))}")
    parser.add_argument("--no-baselines", default="", metavar="NAMES", help="skip e.g. loky,pebble (PPE always runs)")
    parser.add_argument("--json", help="where to write the results (default: benchmarks/results/latest.json, "
                        "or quick.json with --quick, so a smoke run never overwrites a measurement)")
    parser.add_argument("--show", metavar="PATH", help="print the table of an earlier run's JSON and exit")
    args = parser.parse_args(argv)
    if args.show:
        with open(args.show) as f:
            data = json.load(f)
        print(table([Row(**r) for r in data["results"]], data["baselines"]))
        return 0

    sizes = Sizes.quick() if args.quick else Sizes()
    if args.jobs is not None:
        sizes.jobs = args.jobs
    for item in args.set:
        name, _, value = item.partition("=")
        sizes.override(name.strip(), value.strip())
    databases = [ALIASES.get(d.strip(), d.strip()) for d in args.databases.split(",") if d.strip()]
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for name in scenarios:
        if name not in SCENARIOS:
            parser.error(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    for name in databases:
        if name not in URLS:
            parser.error(f"unknown database {name!r}; known: {', '.join(URLS)}")
    skip = {s.strip() for s in args.no_baselines.split(",") if s.strip()} - {"ppe"}
    found = {k: v for k, v in baselines.available().items() if k not in skip}
    ctx = Context(sizes, args.workers, found)

    info = machine(databases)
    print(f"{info['cpu']}, {info['cores']} cores, {info['ram_gb']} GB, Python {info['python']}, "
          f"baselines: {', '.join(found)}{' (quick)' if args.quick else ''}", flush=True)
    rows: list[Row] = []
    errors: list[dict[str, str]] = []
    timings: dict[str, float] = {}
    started = time.perf_counter()
    for scenario in scenarios:
        for kind in databases:
            t0 = time.perf_counter()
            try:
                got = SCENARIOS[scenario](ctx, kind)
            except Exception as error:  # noqa: BLE001 - one broken cell must not lose the rest of the run
                traceback.print_exc()
                errors.append({"scenario": scenario, "database": kind, "error": f"{type(error).__name__}: {error}"})
                got = []
            timings[f"{scenario}/{kind}"] = time.perf_counter() - t0
            rows += got
            for r in got:
                ratio = "" if r.ratio is None else f"  ratio {r.ratio:.3g}"
                verdict = "" if r.passed is None else ("  pass" if r.passed else "  MISS")
                ref = "ppe" if "ppe" in r.baselines else next(iter(r.baselines), "ppe")
                print(f"  {scenario:<10} {kind:<10} {r.metric:<38} {fmt(r.dbexecutor, r.unit):>12}  "
                      f"{'PPE' if ref == 'ppe' else ref} {fmt(r.baselines.get(ref), r.unit):>12}{ratio}{verdict}",
                      flush=True)
            print(f"  ({scenario}/{kind}: {timings[f'{scenario}/{kind}']:.1f} s)", flush=True)
    total = time.perf_counter() - started
    print()
    print(table(rows, list(found)))
    print(f"\n{len(rows)} rows in {total:.0f} s; {sum(r.passed is False for r in rows)} target(s) missed"
          + (f"; {len(errors)} scenario(s) failed" if errors else ""))
    path = Path(args.json) if args.json else DEFAULT_JSON.with_name("quick.json" if args.quick else "latest.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({
            "machine": info,
            "quick": args.quick,
            "workers": args.workers,
            "sizes": dataclasses.asdict(sizes),
            "baselines": list(found),
            "seconds": {"total": total, **timings},
            "errors": errors,
            "results": [dataclasses.asdict(r) for r in rows],
        }, f, indent=2, default=str)
    print(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
