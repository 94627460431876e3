"""The commands on jobs: ``list``, ``show``, ``retry``, ``cancel`` and ``purge``, and the filters and job ids they take.

:func:`show_data` is what ``show --json`` prints and what the UI's job page shows.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, TextIO

from .. import schema, serialization
from ..blobs import pickle_summary, short as _short, stored_traceback
from ..errors import PayloadRejected
from ..readmodels import JobFilter, StopRequest
from ..store import Store
from .exits import EXIT_NOTHING, EXIT_OK, UsageError, _Failure
from .format import _age, _json, _percent, _table, _when


def _filter(store: Store, args: argparse.Namespace, default_states: Sequence[str] = ()) -> JobFilter:
    """The job filter given on the command line (ages on the database server's clock)."""
    now = store.now()
    older, newer = getattr(args, "older_than", None), getattr(args, "newer_than", None)
    return JobFilter(
        states=tuple(args.state or default_states),
        queue=args.queue,
        group=args.group,
        function=args.function,
        key=getattr(args, "key", None),
        created_before=None if older is None else now - older,
        created_after=None if newer is None else now - newer,
    )


def _filtered(args: argparse.Namespace) -> bool:
    return bool(args.state or args.queue or args.group or args.function)


def _ids(args: argparse.Namespace, exactly_one: bool = False) -> list[int]:
    ids = list(args.ids)
    if exactly_one and len(ids) != 1:
        raise UsageError("give exactly one job id")
    return ids


def cmd_list(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``list``: jobs matching the filters, newest first (exit 1 if none)."""
    now = store.now()
    found = store.console.list_jobs(_filter(store, args), limit=args.limit)
    rows = [r.as_dict() for r in found]
    if args.json:
        _json(rows, out)
    else:
        _table(
            ["ID", "STATE", "QUEUE", "GROUP", "FUNCTION", "KEY", "ATTEMPT", "AGE", "WORKER", "ERROR"],
            [
                [r["id"], r["state"], _short(r["queue"], 20), _short(r["group"], 20), _short(r["function"], 50), _short(r["key"], 24),
                 r["attempt"], _age(now - r["created_at"]), r["worker"] or "-", _short(r["error"], 60)]
                for r in rows
            ],
            out,
        )
    return EXIT_OK if rows else EXIT_NOTHING


def _signature(store: Store, blob: bytes | None, context: bytes) -> str:
    if blob is None:
        return "-"
    if not store.signer.enabled:
        return "signed (not checked: no secret given)" if serialization.strip_signature(bytes(blob))[1] else "unsigned"
    try:
        store.signer.open(bytes(blob), context)
        return "valid"
    except PayloadRejected as rejected:
        return f"REJECTED: {rejected}"


def show_data(store: Store, job_id: int) -> dict[str, Any] | None:
    """What ``show --json`` prints for one job (and the UI's job page shows); None if there is no such job."""
    detail = store.console.job_detail(job_id)
    if detail is None:
        return None
    return {
        **detail.as_dict(),
        "arguments": pickle_summary(detail.payload),
        "payload_signature": _signature(store, detail.payload, serialization.PAYLOAD_CONTEXT),
        "result_size": None if detail.result is None else len(detail.result),
        "result_signature": _signature(store, detail.result, serialization.blob_context(job_id, detail.state)),
        "traceback": stored_traceback(detail.result) if detail.state == schema.FAILED else None,
    }


def cmd_show(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``show``: one job in full: its call, edges, attempts, progress and traceback."""
    (job_id,) = _ids(args, exactly_one=True)
    info = show_data(store, job_id)
    if info is None:
        raise _Failure(EXIT_NOTHING, f"no job with id {job_id}")
    if args.json:
        _json(info, out)
        return EXIT_OK
    w = out.write
    w(f"job {job_id}: {info['state']}\n")
    w(f"  function   {info['function']}\n")
    args_info = info["arguments"]
    w(f"  payload    {args_info['size']} bytes, signature: {info['payload_signature']}\n")
    w(f"  refers to  {', '.join(args_info['globals']) or '-'}\n")
    w(f"  values     {', '.join(repr(v) for v in args_info['values']) or '-'}\n")
    for label in ("key", "queue", "group", "priority", "timeout"):
        w(f"  {label:<10} {info[label] if info[label] is not None else '-'}\n")
    w(f"  attempt    {info['attempt']} (retries allowed up to attempt {info['retries'] + 1})\n")
    w(f"  created    {_when(info['created_at'])}   started {_when(info['started_at'])}   finished {_when(info['finished_at'])}\n")
    if info["worker"]:
        w(f"  lease      {info['worker']} until {_when(info['lease_expires'])}\n")
    progress = info["progress"]
    if progress:
        w(f"  progress   {_percent(progress['fraction'])} {progress['message'] or ''} (at {_when(progress['at'])})\n")
    if info["terminate_requested"]:
        w(f"  stopping   asked to stop at {_when(info['terminate_requested'])}\n")
    if info["result_size"] is not None:
        w(f"  result     {info['result_size']} bytes, signature: {info['result_signature']}\n")
    w(f"  error      {info['error'] or '-'}\n")
    for label, edges in (("depends on", info["depends_on"]), ("dependents", info["dependents"])):
        w(f"  {label} " + (", ".join(f"{e['id']} ({e['state']})" for e in edges) or "-") + "\n")
    if info["attempts"]:
        w("\nattempts\n")
        _table(
            ["ATTEMPT", "OUTCOME", "WORKER", "STARTED", "ENDED", "DETAIL"],
            [[a["attempt"], a["outcome"], a["worker"] or "-", _when(a["started_at"]), _when(a["ended_at"]), _short(a["detail"], 70)]
             for a in info["attempts"]],
            out,
        )
    if info["traceback"]:
        w("\ntraceback (from the child)\n" + info["traceback"] + "\n")
    return EXIT_OK


def cmd_retry(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``retry``: failed or cancelled jobs, by id or by filter, back to ready, with the dependents that failed because of them."""
    ids = _ids(args)
    if args.failed:
        args.state = sorted(set(args.state or ()) | {schema.FAILED})
    if ids and _filtered(args):
        raise UsageError("give job ids or filters (--failed, --state, --group, --function), not both")
    if ids:
        revived, refused = store.retry(ids, args.retries, store.now())
    elif _filtered(args):
        revived, refused = store.console.retry_matching(_filter(store, args, default_states=(schema.FAILED,)), args.retries)
    else:
        raise UsageError("retry needs job ids, or filters: --failed, --state, --group, --function")
    if args.json:
        _json({"revived": revived, "refused": refused}, out)
    elif not revived and not refused:
        out.write("no job matches\n")
    else:
        for jid, state in sorted(revived.items()):
            note = "" if jid in ids or not ids else " (dependent)"
            out.write(f"job {jid}: {state}{note}\n")
        for jid, why in sorted(refused.items()):
            out.write(f"job {jid}: not retried: {why}\n")
    return EXIT_OK if revived else EXIT_NOTHING


def cmd_cancel(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``cancel``: jobs that have not started (with ``--running``, running ones too), by id or by filter, and their dependents."""
    ids = _ids(args)
    if ids and _filtered(args):
        raise UsageError("give job ids or filters (--state, --group, --function), not both")
    if not ids and not _filtered(args):
        raise UsageError("cancel needs job ids, or filters: --state, --group, --function")
    if args.running:
        if ids:
            request = store.request_stop(ids)
        else:
            request = store.console.stop_matching(_filter(store, args, default_states=schema.PENDING_STATES + schema.ACTIVE_STATES))
    else:
        if args.state and set(args.state) - set(schema.PENDING_STATES):
            raise UsageError("only waiting or ready jobs can be cancelled; add --running to stop running ones")
        if ids:
            cancelled = sorted(f.job_id for f in store.cancel(ids, store.now()))
            missed: dict[int, str] = {}
            for jid in ids:
                if jid not in cancelled:
                    row = store.job(jid)
                    missed[jid] = "no such job" if row is None else f"it is {row.state}; only waiting or ready jobs can be cancelled (--running stops running ones)"
            request = StopRequest(cancelled, [], missed)
        else:
            request = store.console.stop_matching(_filter(store, args, default_states=schema.PENDING_STATES), running=False)
    if args.json:
        _json(request.as_dict(), out)
    else:
        if not request.cancelled and not request.terminating and not request.refused:
            out.write("no job matches\n")
        for jid in request.cancelled:
            out.write(f"job {jid}: cancelled{' (dependent)' if ids and jid not in ids else ''}\n")
        for jid in request.terminating:
            out.write(f"job {jid}: running; its owner stops it at its next beat\n")
        for jid, why in sorted(request.refused.items()):
            out.write(f"job {jid}: not cancelled: {why}\n")
    asked = set(ids) if ids else set(request.cancelled) | set(request.terminating)
    acted = (set(request.cancelled) | set(request.terminating)) & asked
    return EXIT_OK if acted else EXIT_NOTHING


def cmd_purge(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    """``purge``: delete finished jobs older than ``--older-than``, ``--batch`` of them per transaction."""
    deleted = store.purge(store.now() - args.older_than, args.batch)
    if args.json:
        _json({"deleted": deleted}, out)
    else:
        out.write(f"deleted {deleted} finished job(s) older than {args.older_than:g} s\n")
    return EXIT_OK
