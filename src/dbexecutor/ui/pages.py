"""The UI's pages as HTML, from the store's read models: every text from the database is escaped here.

Each page works without JavaScript. The parts that change while one looks
are marked ``data-live`` (with an id): the page's script fetches the same
URL every few seconds and swaps those parts, so a page stays live without
a reload and without a second way of rendering it.

Times are the database server's: ages are counted from its ``now``, and
absolute times are shown in UTC.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from .. import __version__, states
from ..durations import format_age
from ..readmodels import ExecutorInfo, GroupInfo, JobGraph, JobPage, Overview
from . import layout

__all__ = ["View", "overview_page", "jobs_page", "job_page", "graph_page", "workers_page", "login_page", "message_page"]

_STATES = states.ALL_STATES
_ACTIVE = states.ACTIVE_STATES
_OUTCOMES = ("ok", "exception", "timeout", "terminated")
_PAUSED = '<span class="badge st-cancelled">paused</span>'
_STOPPING = ' <span class="badge st-cancelled">stopping</span>'
_ALIVE, _STOPPED, _DEAD = (f'<span class="badge st-{c}">{t}</span>' for c, t in (("done", "alive"), ("cancelled", "stopped"), ("failed", "dead")))


@dataclass(frozen=True)
class View:
    """What every page needs besides its data: who is looking and what they may do."""

    database: str  # the URL, password masked
    prefix: str
    can_act: bool  # logged in with the token
    login: bool  # the UI has a token, so logging in is possible
    csrf: str | None
    refresh: float
    notice: str | None = None
    error: str | None = None


def esc(value: Any) -> str:
    """``value`` as HTML text (quotes escaped too: safe in attributes)."""
    return escape("" if value is None else str(value), quote=True)


def ago(seconds: float | None) -> str:
    """A duration in a few characters: ``4.2s``, ``3m05s``, ``2h10m``, ``3d04h``."""
    return format_age(seconds)


def when(ts: float | None) -> str:
    """An absolute time in UTC."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def badge(state: str) -> str:
    """A job state as a coloured label."""
    return f'<span class="badge st-{esc(state)}">{esc(state)}</span>'


def bar(fraction: float | None, label: str = "") -> str:
    """A progress bar (empty when nothing was reported)."""
    if fraction is None:
        return f'<span class="muted">{esc(label) or "-"}</span>'
    pct = max(0.0, min(1.0, fraction)) * 100
    return (
        f'<span class="progress" title="{pct:.0f}%"><span class="fill" style="width:{pct:.1f}%"></span></span> '
        f'<span class="pct">{pct:.0f}%</span> <span class="muted">{esc(label)}</span>'
    )


def stacked(counts: Mapping[str, int]) -> str:
    """A group's jobs as one bar, a segment per state (finished ones first)."""
    total = sum(counts.values())
    if not total:
        return '<span class="stack empty"></span>'
    order = ("done", "failed", "cancelled", "running", "leased", "ready", "waiting")
    segs = "".join(
        f'<span class="seg st-{s}" style="width:{100 * counts.get(s, 0) / total:.2f}%" title="{s} {counts.get(s, 0)}"></span>'
        for s in order
        if counts.get(s, 0)
    )
    done = counts.get("done", 0)
    return f'<span class="stack">{segs}</span> <span class="pct">{done}/{total}</span>'


def _link_job(job_id: int) -> str:
    return f'<a href="/jobs/{int(job_id)}">{int(job_id)}</a>'


def _short(text: Any, width: int) -> str:
    s = "" if text is None else " ".join(str(text).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _cell(text: Any, width: int = 60) -> str:
    """Text cut for a table cell, the whole of it in the tooltip."""
    if text is None or text == "":
        return '<span class="muted">-</span>'
    full = " ".join(str(text).split())
    return f'<span title="{esc(full)}">{esc(_short(full, width))}</span>'


def action(view: View, url: str, label: str, *, fields: Mapping[str, str] | None = None, confirm: str | None = None,
           extra: str = "", kind: str = "") -> str:
    """A form that POSTs an action, only for a viewer who may act (with the session's CSRF token)."""
    if not view.can_act or view.csrf is None:
        return ""
    hidden = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in (fields or {}).items())
    ask = f' data-confirm="{esc(confirm)}"' if confirm else ""
    return (
        f'<form method="post" action="{esc(url)}" class="action"{ask}>'
        f'<input type="hidden" name="csrf" value="{esc(view.csrf)}">{hidden}{extra}'
        f'<button type="submit" class="btn {esc(kind)}">{esc(label)}</button></form>'
    )


def _shell(view: View, title: str, active: str, body: str) -> str:
    nav = "".join(
        f'<a href="{href}" class="{"on" if name == active else ""}">{name}</a>'
        for name, href in (("Overview", "/"), ("Jobs", "/jobs"), ("Graph", "/graph"), ("Workers", "/workers"))
    )
    if view.can_act:
        who = (
            f'<form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" value="{esc(view.csrf)}">'
            '<button class="link" type="submit">log out</button></form>'
        )
        mode = '<span class="mode act">actions enabled</span>'
    elif view.login:
        who, mode = '<a href="/login">log in</a>', '<span class="mode">read-only</span>'
    else:
        who, mode = "", '<span class="mode">read-only</span>'
    notes = ""
    if view.notice:
        notes += f'<p class="notice" role="status">{esc(view.notice)}</p>'
    if view.error:
        notes += f'<p class="notice error" role="alert">{esc(view.error)}</p>'
    refresh = f' data-refresh="{view.refresh:g}"' if view.refresh > 0 else ""
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · dbexecutor</title>"
        '<link rel="stylesheet" href="/static/app.css"><script src="/static/app.js" defer></script></head>'
        f'<body{refresh}><header><span class="brand">dbexecutor</span><nav>{nav}</nav>'
        f'<span class="where" title="database and table prefix">{esc(view.database)} · prefix {esc(view.prefix) or "(none)"}</span>'
        f"{mode}{who}</header><main>{notes}<h1>{esc(title)}</h1>{body}</main>"
        f'<footer><span id="live-status">live</span> · dbexecutor {esc(__version__)}</footer></body></html>'
    )


# -- overview -----------------------------------------------------------------------------------------


def _chart(ov: Overview) -> str:
    flow = ov.throughput
    totals = [d + f + c for d, f, c in zip(flow.done, flow.failed, flow.cancelled)]
    top = max(totals + [1])
    w, h, pad = 600, 150, 24
    bw = (w - pad) / max(len(totals), 1)
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h + 18}" role="img" '
        f'aria-label="jobs finished per minute, the last {len(totals)} minutes">'
        f'<text class="axis" x="0" y="10">{top}/min</text>'
        f'<line class="axis" x1="{pad}" y1="{h}" x2="{w}" y2="{h}"/>'
    ]
    for i, (d, f, c) in enumerate(zip(flow.done, flow.failed, flow.cancelled)):
        x = pad + i * bw + 2
        y = float(h)
        for value, cls in ((d, "done"), (f, "failed"), (c, "cancelled")):
            if value:
                height = (h - 14) * value / top
                y -= height
                parts.append(
                    f'<rect class="st-{cls}" x="{x:.1f}" y="{y:.1f}" width="{bw - 4:.1f}" height="{height:.1f}">'
                    f"<title>{value} {cls}, {len(totals) - i} min ago</title></rect>"
                )
    for i, label in ((0, f"-{len(totals)}m"), (len(totals) // 2, f"-{len(totals) - len(totals) // 2}m"), (len(totals) - 1, "now")):
        parts.append(f'<text class="axis" x="{pad + i * bw + 2:.1f}" y="{h + 14}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def overview_page(view: View, ov: Overview) -> str:
    """Jobs per state and group, throughput, ETA, running jobs, group settings and their actions."""
    st = ov.status
    counts = st.states.as_dict()
    chips = "".join(
        f'<a class="chip st-{s}" href="/jobs?{urlencode({"state": s})}"><b>{counts[s]}</b> {s}</a>' for s in _STATES
    )
    rate = ov.throughput.rate(5)
    oldest = st.oldest_ready
    summary = (
        f'<div class="chips">{chips}</div>'
        '<dl class="facts">'
        f"<dt>total</dt><dd>{st.total}</dd>"
        f'<dt>queued</dt><dd id="queued">{ov.queued}</dd>'
        f'<dt>throughput</dt><dd>{rate * 60:.1f} jobs/min <span class="muted">(last 5 min)</span></dd>'
        f'<dt>ETA</dt><dd id="eta">{"-" if ov.eta is None else ago(ov.eta)}</dd>'
        f'<dt>live executors</dt><dd><a href="/workers">{ov.workers_alive}</a></dd>'
        f"<dt>oldest ready</dt><dd>{'-' if oldest is None else _link_job(oldest.id) + ' waiting ' + ago(oldest.age)}</dd>"
        "</dl>"
    )
    settings = {g.name: g for g in ov.groups}
    rows = []
    for name in sorted(set(st.groups) | set(settings)):
        c = st.groups[name].as_dict() if name in st.groups else {s: 0 for s in _STATES}
        g = settings.get(name)
        paused = g is not None and g.limit == 0
        limit = "-" if g is None or g.limit is None else ("paused" if paused else str(g.limit))
        if g is None:
            act = ""
        elif paused:
            act = action(view, f"/groups/{quote(name, safe='')}/resume", "Resume", kind="go",
                         extra='<input type="text" name="limit" size="4" placeholder="limit" title="a limit to resume with (empty: none)">')
        else:
            act = action(view, f"/groups/{quote(name, safe='')}/pause", "Pause", kind="warn", confirm=f"Pause group {name}? Running jobs go on; no new ones start.")
        rows.append(
            f'<tr data-group="{esc(name)}"><td><a href="/jobs?{urlencode({"group": name})}">{esc(name)}</a></td>'
            f"<td>{'-' if g is None else g.weight}</td><td>{_PAUSED if paused else esc(limit)}</td>"
            f"<td>{stacked(c)}</td><td>{c['waiting']}</td><td>{c['ready']}</td><td>{c['leased'] + c['running']}</td>"
            f"<td>{c['done']}</td><td>{c['failed']}</td><td>{c['cancelled']}</td><td>{act}</td></tr>"
        )
    groups = (
        '<table class="grid"><thead><tr><th>group</th><th>weight</th><th>limit</th><th>progress</th><th>waiting</th>'
        "<th>ready</th><th>running</th><th>done</th><th>failed</th><th>cancelled</th><th></th></tr></thead>"
        f"<tbody>{''.join(rows) or '<tr><td colspan=11 class=muted>no groups</td></tr>'}</tbody></table>"
    )
    running = "".join(
        f"<tr><td>{_link_job(r.id)}</td><td>{badge(r.state)}{_STOPPING if r.terminate_requested else ''}</td>"
        f"<td>{_cell(r.function, 50)}</td><td>{esc(r.group)}</td><td>{_cell(r.worker, 30)}</td><td>{r.attempt}</td>"
        f"<td>{ago(r.age)}</td><td>{bar(r.progress, r.progress_message or '')}</td></tr>"
        for r in st.running
    )
    running_table = (
        '<table class="grid"><thead><tr><th>id</th><th>state</th><th>function</th><th>group</th><th>worker</th>'
        "<th>attempt</th><th>age</th><th>progress</th></tr></thead>"
        f"<tbody>{running or '<tr><td colspan=8 class=muted>nothing running</td></tr>'}</tbody></table>"
    )
    body = (
        f'<section id="summary" data-live>{summary}</section>'
        f'<section><h2>Finished per minute</h2><div id="flow" data-live>{_chart(ov)}'
        '<p class="legend"><span class="key st-done"></span>done <span class="key st-failed"></span>failed '
        '<span class="key st-cancelled"></span>cancelled</p></div></section>'
        f'<section><h2>Groups</h2><div id="groups" data-live>{groups}</div></section>'
        f'<section><h2>Running</h2><div id="running" data-live>{running_table}</div></section>'
    )
    return _shell(view, "Overview", "Overview", body)


# -- jobs ---------------------------------------------------------------------------------------------


def jobs_page(
    view: View,
    page: JobPage,
    filters: Mapping[str, str],
    groups: Sequence[GroupInfo],
    functions: Sequence[str],
    now: float,
) -> str:
    """The list of jobs: a filter form, a page of rows, links to the newer and older pages."""
    state = filters.get("state", "")
    group = filters.get("group", "")
    options = "".join(f'<option value="{s}"{" selected" if s == state else ""}>{s}</option>' for s in _STATES)
    group_options = "".join(
        f'<option value="{esc(g.name)}"{" selected" if g.name == group else ""}>{esc(g.name)}</option>' for g in groups
    )
    fn_list = "".join(f'<option value="{esc(f)}">' for f in functions)
    form = (
        '<form method="get" action="/jobs" class="filters">'
        f'<label>state <select name="state"><option value="">any</option>{options}</select></label>'
        f'<label>group <select name="group"><option value="">any</option>{group_options}</select></label>'
        f'<label>queue <input name="queue" value="{esc(filters.get("queue", ""))}" size="12"></label>'
        f'<label>function <input name="function" list="functions" value="{esc(filters.get("function", ""))}" '
        f'placeholder="module.name" size="28"></label><datalist id="functions">{fn_list}</datalist>'
        f'<label>key <input name="key" value="{esc(filters.get("key", ""))}" size="16"></label>'
        f'<label>newer than <input name="newer" value="{esc(filters.get("newer", ""))}" placeholder="1h" size="5"></label>'
        f'<label>older than <input name="older" value="{esc(filters.get("older", ""))}" placeholder="7d" size="5"></label>'
        '<button type="submit" class="btn">Filter</button> <a href="/jobs">clear</a></form>'
    )
    rows = "".join(
        f'<tr data-job="{j.id}"><td>{_link_job(j.id)}</td><td>{badge(j.state)}</td><td>{esc(j.group)}</td>'
        f"<td>{_cell(j.queue, 20)}</td><td>{_cell(j.function, 50)}</td><td>{_cell(j.key, 24)}</td><td>{j.attempt}</td>"
        f"<td>{ago(now - j.created_at)}</td><td>{_cell(j.worker, 26)}</td>"
        f"<td>{bar(j.progress, j.progress_message or '') if j.state in _ACTIVE else ''}</td><td>{_cell(j.error, 60)}</td></tr>"
        for j in page.jobs
    )
    keep = {k: v for k, v in filters.items() if v and k not in ("before", "after")}
    pager = '<nav class="pager">'
    if page.newer is not None:
        pager += f'<a href="/jobs?{esc(urlencode({**keep, "after": page.newer}))}" rel="prev">← newer</a>'
    if page.older is not None:
        pager += f'<a href="/jobs?{esc(urlencode({**keep, "before": page.older}))}" rel="next">older →</a>'
    pager += "</nav>"
    table = (
        '<table class="grid"><thead><tr><th>id</th><th>state</th><th>group</th><th>queue</th><th>function</th><th>key</th>'
        "<th>attempt</th><th>age</th><th>worker</th><th>progress</th><th>error</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=11 class=muted>no job matches</td></tr>'}</tbody></table>"
    )
    return _shell(view, "Jobs", "Jobs", form + f'<div id="jobs" data-live>{table}{pager}</div>')


# -- one job ------------------------------------------------------------------------------------------


def _timeline(info: Mapping[str, Any], now: float) -> str:
    """The attempts on a time axis: one bar each, coloured by outcome; the one running now reaches to now."""
    spans: list[tuple[str, float, float, str, str]] = []
    for a in info["attempts"]:
        start = a["started_at"] if a["started_at"] is not None else a["ended_at"]
        outcome = a["outcome"]
        kind = outcome if outcome in _OUTCOMES else "other"
        spans.append((f"#{a['attempt']}", start, a["ended_at"], kind, f"attempt {a['attempt']}: {outcome} on {a['worker'] or '?'}"))
    if info["state"] in _ACTIVE and info["started_at"] is not None:
        spans.append((f"#{info['attempt']}", info["started_at"], now, "running", f"attempt {info['attempt']}: {info['state']} now"))
    if not spans:
        return '<p class="muted">no attempt yet</p>'
    lo = min(s for _, s, _, _, _ in spans)
    hi = max(max(e for _, _, e, _, _ in spans), lo + 0.001)
    w, row, left = 640, 22, 40
    h = row * len(spans) + 18
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" aria-label="attempts">']
    for i, (label, s, e, kind, title) in enumerate(spans):
        x = left + (w - left - 10) * (s - lo) / (hi - lo)
        width = max(3.0, (w - left - 10) * (e - s) / (hi - lo))
        y = i * row + 2
        parts.append(
            f'<text class="axis" x="2" y="{y + 14}">{esc(label)}</text>'
            f'<rect class="out-{kind}" x="{x:.1f}" y="{y}" width="{width:.1f}" height="{row - 6}" rx="3">'
            f"<title>{esc(title)}, {ago(e - s)}</title></rect>"
        )
    parts.append(
        f'<text class="axis" x="{left}" y="{h - 2}">{esc(when(lo))}</text>'
        f'<text class="axis" x="{w - 10}" y="{h - 2}" text-anchor="end">+{ago(hi - lo)}</text></svg>'
    )
    return "".join(parts)


def _edges(edges: Sequence[Mapping[str, Any]]) -> str:
    if not edges:
        return '<span class="muted">none</span>'
    return " ".join(f'<span class="edge">{_link_job(e["id"])} {badge(e["state"])}</span>' for e in edges)


def job_page(view: View, info: Mapping[str, Any], now: float) -> str:
    """One job: what it calls (read without unpickling), its state and progress, attempts, traceback, edges, actions."""
    job_id = int(info["id"])
    state = info["state"]
    args = info["arguments"]
    acts = ""
    if state in (states.FAILED, states.CANCELLED):
        acts += action(view, f"/jobs/{job_id}/retry", "Retry", kind="go",
                       extra='<label class="small">further retries <input type="number" name="retries" value="0" min="0" max="100"></label>')
    if state in states.PENDING_STATES:
        acts += action(view, f"/jobs/{job_id}/cancel", "Cancel", kind="warn", confirm=f"Cancel job {job_id} and everything that waits on it?")
    if state in _ACTIVE and not info["terminate_requested"]:
        acts += action(view, f"/jobs/{job_id}/terminate", "Terminate", kind="warn",
                       confirm=f"Terminate job {job_id}? Its process tree is killed where it runs, and it ends cancelled.")
    progress = info["progress"]
    facts = [
        ("state", badge(state) + (' <span class="badge st-cancelled">stopping</span>' if info["terminate_requested"] and state in _ACTIVE else "")),
        ("function", f"<code>{esc(info['function'])}</code>"),
        ("group", f'<a href="/jobs?{esc(urlencode({"group": info["group"]}))}">{esc(info["group"])}</a>'),
        ("key", esc(info["key"]) if info["key"] else '<span class="muted">-</span>'),
        ("priority", esc(info["priority"])),
        ("attempt", f"{info['attempt']} of up to {info['retries'] + 1}"),
        ("timeout", "-" if info["timeout"] is None else f"{info['timeout']:g} s"),
        ("created", f'{esc(when(info["created_at"]))} <span class="muted">({ago(now - info["created_at"])} ago)</span>'),
        ("started", esc(when(info["started_at"]))),
        ("finished", esc(when(info["finished_at"]))),
        ("worker", esc(info["worker"] or "-") + (f' <span class="muted">lease until {esc(when(info["lease_expires"]))}</span>' if info["lease_expires"] else "")),
        ("not before", esc(when(info["run_after"]))),
        ("progress", bar(None if progress is None else progress["fraction"], "" if progress is None else (progress["message"] or ""))),
        ("error", f'<span class="error">{esc(info["error"])}</span>' if info["error"] else '<span class="muted">-</span>'),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    call = (
        '<dl class="facts">'
        f"<dt>refers to</dt><dd>{esc(', '.join(args['globals'])) or '-'}</dd>"
        f"<dt>values</dt><dd><code>{esc(', '.join(repr(v) for v in args['values'])) or '-'}</code></dd>"
        f"<dt>payload</dt><dd>{args['size']} bytes, signature: {esc(info['payload_signature'])}</dd>"
        + (f"<dt>result</dt><dd>{info['result_size']} bytes, signature: {esc(info['result_signature'])}</dd>" if info["result_size"] is not None else "")
        + '</dl><p class="muted small">Read from the pickle without running it (nothing is imported or unpickled).</p>'
    )
    attempts = "".join(
        f'<tr><td>{a["attempt"]}</td><td><span class="out out-{esc(a["outcome"] if a["outcome"] in _OUTCOMES else "other")}">{esc(a["outcome"])}</span></td>'
        f"<td>{_cell(a['worker'], 30)}</td><td>{esc(when(a['started_at']))}</td><td>{esc(when(a['ended_at']))}</td>"
        f"<td>{'-' if a['started_at'] is None else ago(a['ended_at'] - a['started_at'])}</td><td>{_cell(a['detail'], 80)}</td></tr>"
        for a in info["attempts"]
    )
    traceback = (
        f'<section><h2>Traceback</h2><pre class="traceback" id="traceback">{esc(info["traceback"])}</pre></section>'
        if info["traceback"] else ""
    )
    body = (
        f'<div id="job" data-live data-state="{esc(state)}">'
        f'<div class="actions">{acts}</div>'
        f'<div class="cols"><section><dl class="facts">{dl}</dl></section>'
        f"<section><h2>Call</h2>{call}</section></div>"
        f"<section><h2>Attempts</h2>{_timeline(info, now)}"
        '<table class="grid"><thead><tr><th>#</th><th>outcome</th><th>worker</th><th>started</th><th>ended</th>'
        f"<th>took</th><th>detail</th></tr></thead><tbody>{attempts or '<tr><td colspan=7 class=muted>none</td></tr>'}</tbody></table></section>"
        f"{traceback}"
        f'<section><h2>Dependencies</h2><dl class="facts"><dt>upstream</dt><dd id="upstream">{_edges(info["depends_on"])}</dd>'
        f'<dt>downstream</dt><dd id="downstream">{_edges(info["dependents"])}</dd></dl>'
        f'<p><a href="/graph?job={job_id}">graph of the jobs connected to this one →</a></p></section></div>'
    )
    return _shell(view, f"Job {job_id}", "Jobs", body)


# -- graph ----------------------------------------------------------------------------------------------


def graph_page(view: View, graph: JobGraph | None, job: str, key: str) -> str:
    """A form to pick a job or a key prefix, and the DAG of the jobs connected to them, coloured by state."""
    form = (
        '<form method="get" action="/graph" class="filters">'
        f'<label>job <input name="job" value="{esc(job)}" size="8" inputmode="numeric"></label>'
        f'<label>or keys starting with <input name="key" value="{esc(key)}" size="24"></label>'
        '<button type="submit" class="btn">Draw</button></form>'
    )
    legend = '<p class="legend">' + " ".join(f'<span class="key st-{s}"></span>{s}' for s in _STATES) + "</p>"
    if graph is None:
        inner = '<p class="muted">Pick a job (its batch, or what it depends on and what depends on it) or a key prefix.</p>'
    elif not graph.nodes:
        inner = '<p class="muted">no such job</p>'
    else:
        counts: dict[str, int] = {}
        for n in graph.nodes:
            counts[n.state] = counts.get(n.state, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        more = ' <span class="badge st-failed">truncated: more jobs are connected</span>' if graph.truncated else ""
        inner = (
            f'<p>{len(graph.nodes)} jobs, {len(graph.edges)} edges: {esc(summary)}{more}</p>'
            f'<div class="graphbox">{layout.svg(graph.nodes, graph.edges)}</div>'
        )
    return _shell(view, "Graph", "Graph", form + legend + f'<div id="graph" data-live>{inner}</div>')


# -- workers --------------------------------------------------------------------------------------------


def workers_page(view: View, workers: Sequence[ExecutorInfo]) -> str:
    """The registry of executors: where each runs, since when, what it holds, whether it is alive."""
    rows = "".join(
        f'<tr data-worker="{esc(e.name)}"><td>{esc(e.name)}</td><td>{esc(e.kind)}</td><td>{esc(e.host)}</td><td>{e.pid}</td>'
        f"<td>{esc(e.version)}</td><td>{e.slots}</td><td>{e.running}</td><td>{ago(e.age)}</td><td>{ago(e.since_beat)} ago</td>"
        f"<td>{_ALIVE if e.alive else (_STOPPED if e.stopped_at is not None else _DEAD)}"
        f"{'' if e.rescue_in is None else ' <span class=muted>jobs back to ready in ' + ago(e.rescue_in) + '</span>'}</td></tr>"
        for e in workers
    )
    table = (
        '<table class="grid"><thead><tr><th>name</th><th>kind</th><th>host</th><th>pid</th><th>version</th><th>slots</th>'
        "<th>running</th><th>age</th><th>last beat</th><th>status</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=10 class=muted>no executor or worker has registered</td></tr>'}</tbody></table>"
    )
    return _shell(view, "Workers", "Workers", f'<div id="workers" data-live>{table}</div>')


# -- login and messages -----------------------------------------------------------------------------------


def login_page(view: View) -> str:
    """The form that trades the token for a session."""
    if not view.login:
        return message_page(view, "Read-only", "This UI was started without a token: nothing can be changed from it.")
    body = (
        '<form method="post" action="/login" class="login">'
        '<label>token <input type="password" name="token" autocomplete="current-password" autofocus required></label>'
        '<button type="submit" class="btn go">Log in</button></form>'
        '<p class="muted small">The token the UI was started with (--token, --token-file or $DBEXECUTOR_UI_TOKEN).</p>'
    )
    return _shell(view, "Log in", "", body)


def message_page(view: View, title: str, text: str) -> str:
    """A page that only says something (not found, refused...)."""
    return _shell(view, title, "", f"<p>{esc(text)}</p>")
