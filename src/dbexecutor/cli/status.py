"""``dbexecutor status``: counts per state, queue and group, running jobs, flow and the oldest ready job, once or watched."""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from .. import schema
from ..blobs import short as _short
from ..store import Store, masked_url
from .exits import EXIT_OK
from .format import _age, _bar, _json, _percent, _table


def _status_data(store: Store) -> dict[str, Any]:
    data = store.console.overview().as_dict()
    data["database"] = masked_url(store.url)
    data["prefix"] = store.prefix
    return data


def _print_status(data: dict[str, Any], out: TextIO) -> None:
    out.write(f"database  {data['database']}  prefix {data['prefix']!r}\n")
    states = data["states"]
    out.write(f"jobs      {data['total']} total: " + "  ".join(f"{s} {states[s]}" for s in schema.ALL_STATES) + "\n")
    flow = data["throughput"]
    done_15, failed_15 = sum(flow["done"]), sum(flow["failed"])
    rate = (sum(flow["done"][-5:]) + sum(flow["failed"][-5:])) / (5 * flow["bucket"])
    eta = "-" if data["eta"] is None else _age(data["eta"])
    out.write(
        f"flow      {rate:.2f} jobs/s over the last 5 min ({done_15} done, {failed_15} failed in 15 min); "
        f"{data['queued']} queued, ETA {eta}; {data['workers_alive']} live executor(s)\n\n"
    )
    if len(data.get("queues", {})) > 1 or set(data.get("queues", {})) - {schema.DEFAULT_QUEUE}:
        _table(
            ["QUEUE", "TOTAL", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED"],
            [
                [q, sum(c.values()), c["waiting"], c["ready"], c["leased"] + c["running"], c["done"], c["failed"], c["cancelled"]]
                for q, c in data["queues"].items()
            ],
            out,
        )
        out.write("\n")
    if data["groups"]:
        rows = []
        settings = data.get("group_settings", {})
        for g, c in data["groups"].items():
            total = sum(c.values())
            conf = settings.get(g, {})
            limit = conf.get("limit")
            rows.append([
                g, conf.get("weight", "-"), "-" if limit is None else limit, total, c["waiting"], c["ready"],
                c["leased"] + c["running"], c["done"], c["failed"], c["cancelled"], _bar(c["done"], total),
            ])
        _table(
            ["GROUP", "WEIGHT", "LIMIT", "TOTAL", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED",
             "PROGRESS (done/total)"],
            rows,
            out,
        )
        out.write("\n")
    if data["running"]:
        out.write("running\n")
        _table(
            ["ID", "STATE", "GROUP", "FUNCTION", "WORKER", "ATTEMPT", "AGE", "PROGRESS"],
            [
                [r["id"], r["state"] + (" (stopping)" if r["terminate_requested"] else ""), r["group"],
                 _short(r["function"], 50), _holder(r), r["attempt"], _age(r["age"]),
                 _short(" ".join(x for x in (_percent(r["progress"]) if r["progress"] is not None else "", r["progress_message"] or "") if x) or "-", 40)]
                for r in data["running"]
            ],
            out,
        )
        out.write("\n")
    oldest = data["oldest_ready"]
    if oldest:
        out.write(f"oldest ready: job {oldest['id']} ({_short(oldest['function'], 60)}, group {oldest['group']}) waiting {_age(oldest['age'])}\n")
    else:
        out.write("oldest ready: none\n")


def _holder(job: dict[str, Any]) -> str:
    """Who holds a running job, and if that executor is dead, when the job will be rescued."""
    worker = job["worker"] or "-"
    if job.get("worker_alive") is False:
        rescue = job.get("rescue_in")
        when = "at the next look" if not rescue else f"in {_age(rescue)}"
        return f"{worker} (dead; rescued {when})"
    return worker


def cmd_status(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``status``: counts per state, queue and group, running jobs, throughput and ETA; with ``--watch``, again every ``--interval``."""
    if not args.watch:
        data = _status_data(store)
        _json(data, out) if args.json else _print_status(data, out)
        return EXIT_OK
    shown = 0
    clear = out.isatty() and not args.json
    try:
        while args.count is None or shown < args.count:
            if shown:
                time.sleep(args.interval)
            data = _status_data(store)
            if args.json:
                _json(data, out)
            else:
                out.write("\x1b[H\x1b[2J" if clear else ("\n" if shown else ""))
                out.write(f"{time.strftime('%H:%M:%S')}  every {args.interval:g}s, Ctrl-C to stop\n")
                _print_status(data, out)
            out.flush()
            shown += 1
    except KeyboardInterrupt:
        pass
    return EXIT_OK
