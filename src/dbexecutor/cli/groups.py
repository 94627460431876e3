"""``dbexecutor group``: the groups listed with their jobs, or one shown, or its weight and concurrency limit changed."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .. import schema
from ..store import Store
from .exits import EXIT_NOTHING, EXIT_OK, UsageError, _Failure
from .format import _json, _table
from .parser import _NO_LIMIT_GIVEN


def _group_dict(info: Any, counts: dict[str, int] | None = None) -> dict[str, Any]:
    out = {"name": info.name, "weight": info.weight, "limit": info.limit, "vtime": info.vtime, "paused": info.limit == 0}
    if counts is not None:
        out["jobs"] = counts
    return out


def cmd_group(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``group``: list the groups, or show one, or change its weight and concurrency limit."""
    changes: dict[str, Any] = {}
    if args.weight is not None:
        if args.weight < 1:
            raise UsageError("a weight is an integer >= 1")
        changes["weight"] = args.weight
    if args.limit is not _NO_LIMIT_GIVEN:
        changes["limit"] = args.limit
    if args.name is None:
        if changes:
            raise UsageError("--weight and --limit change one group: name it with --name")
        return _list_groups(store, args, out)
    if changes:
        info = store.configure_group(args.name, **changes)
    else:
        found = [g for g in store.groups() if g.name == args.name]
        if not found:
            raise _Failure(EXIT_NOTHING, f"no group named {args.name!r}")
        info = found[0]
    if args.json:
        _json({k: v for k, v in _group_dict(info).items() if k != "paused"}, out)
    else:
        limit = "none" if info.limit is None else str(info.limit)
        out.write(f"group {info.name}: weight {info.weight}, limit {limit}{' (paused)' if info.limit == 0 else ''}\n")
    return EXIT_OK


def _list_groups(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    counts = store.console.status(running_limit=0).groups
    groups = store.groups()
    rows = [_group_dict(g, counts[g.name].as_dict() if g.name in counts else {s: 0 for s in schema.ALL_STATES}) for g in groups]
    if args.json:
        _json(rows, out)
    else:
        _table(
            ["GROUP", "WEIGHT", "LIMIT", "WAITING", "READY", "RUNNING", "DONE", "FAILED", "CANCELLED"],
            [
                [r["name"], r["weight"], "paused" if r["paused"] else ("none" if r["limit"] is None else r["limit"]),
                 r["jobs"]["waiting"], r["jobs"]["ready"], r["jobs"]["leased"] + r["jobs"]["running"],
                 r["jobs"]["done"], r["jobs"]["failed"], r["jobs"]["cancelled"]]
                for r in rows
            ],
            out,
        )
    return EXIT_OK if rows else EXIT_NOTHING
