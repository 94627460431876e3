"""The web application: routes over the store's front, sessions, actions, JSON and metrics.

::

    GET  /                      overview                 GET /api/overview
    GET  /jobs?state=&group=&queue=... a page of jobs           GET /api/jobs?...
    GET  /jobs/{id}             one job                  GET /api/jobs/{id}
    GET  /graph?job=|key=       a DAG                    GET /api/graph?...
    GET  /workers               the executors            GET /api/workers
    GET  /metrics               Prometheus gauges
    GET  /login, POST /login, POST /logout
    POST /jobs/{id}/retry | cancel | terminate,  /groups/{name}/pause | resume

Starlette runs the plain (``def``) endpoints in its thread pool, so the
store's blocking calls never hold up the event loop; the few ``async`` ones
read a form and hand the store call to that pool too. Reads that every page
polls (the overview, a page of jobs) are shared between viewers for about a
second, so ten open tabs cost the database what one does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import metrics
from ..durations import parse_duration
from ..readmodels import JobFilter
from ..store import Store, masked_url
from . import pages
from .auth import COOKIE, Guard

__all__ = ["create_app"]

_STATIC = Path(__file__).parent / "static"
_PAGE = 50
_CACHE_SECONDS = 1.0
_COST_SHARE = 5.0  # a shared read is kept at least this many times as long as it took
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
_SECURITY_HEADERS = {
    # Scripts only from this server (no inline script, nothing from elsewhere): a
    # string from the database that escaped its escaping still could not run.
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}


class _Shared:
    """Reads shared by every viewer for a moment: one result per key, kept ``ttl`` seconds or longer.

    A read that costs the database more is kept longer (``_COST_SHARE`` times
    its own duration), so however many tabs poll it, and however large the
    tables grow, it takes at most a bounded share of the database's time.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._found: dict[Any, tuple[float, Any]] = {}  # key -> (monotonic expiry, value)

    def get(self, key: Any, read: Callable[[], Any]) -> Any:
        with self._lock:
            hit = self._found.get(key)
            if hit is not None and time.monotonic() < hit[0]:
                return hit[1]
        started = time.monotonic()
        value = read()
        took = time.monotonic() - started
        with self._lock:
            if len(self._found) > 256:  # many filters or pages: start over rather than grow
                self._found.clear()
            self._found[key] = (time.monotonic() + max(self.ttl, _COST_SHARE * took), value)
        return value


def create_app(store: Store, *, token: str | None = None, refresh: float = 2.0, host: str = "127.0.0.1") -> Starlette:
    """The UI for ``store``: read-only without ``token``; ``host`` is where it listens (loopback: only loopback names are served)."""
    guard = Guard(token)
    shared = _Shared(_CACHE_SECONDS)
    registry = metrics.registry(store) if metrics.available() else None
    database = masked_url(store.url)

    def view(request: Request, notice: str | None = None, error: str | None = None) -> pages.View:
        nonce = guard.session(request.cookies)
        return pages.View(
            database=database, prefix=store.prefix, can_act=nonce is not None, login=guard.enabled,
            csrf=None if nonce is None else guard.csrf(nonce), refresh=refresh,
            notice=notice or request.query_params.get("done"), error=error or request.query_params.get("refused"),
        )

    def html(text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})

    # -- reads ------------------------------------------------------------------------------------

    def overview(request: Request) -> Response:
        return html(pages.overview_page(view(request), shared.get("overview", store.console.overview)))

    def api_overview(request: Request) -> Response:
        return JSONResponse(shared.get("overview", store.console.overview).as_dict())

    def _filters(request: Request) -> tuple[dict[str, str], JobFilter, int | None, int | None]:
        q = request.query_params
        given = {k: q.get(k, "").strip() for k in ("state", "group", "queue", "function", "key", "newer", "older", "before", "after")}
        now = store.now()
        try:
            newer = parse_duration(given["newer"]) if given["newer"] else None
            older = parse_duration(given["older"]) if given["older"] else None
            before = int(given["before"]) if given["before"] else None
            after = int(given["after"]) if given["after"] else None
            f = JobFilter(
                states=(given["state"],) if given["state"] else (),
                group=given["group"] or None,
                queue=given["queue"] or None,
                # The whole name: the function index pages through it.
                function=given["function"] or None,
                exact_function=True,
                key=given["key"] or None,
                created_after=None if newer is None else now - newer,
                created_before=None if older is None else now - older,
            )
        except ValueError as error:
            raise _BadRequest(str(error)) from None
        return given, f, before, after

    def jobs(request: Request) -> Response:
        try:
            given, f, before, after = _filters(request)
        except _BadRequest as error:
            return html(pages.message_page(view(request), "Bad filter", str(error)), 400)
        page = shared.get(("page", f, before, after), lambda: store.console.job_page(f, before=before, after=after, limit=_PAGE))
        functions = shared.get("functions", store.console.recent_functions)
        return html(pages.jobs_page(view(request), page, given, store.groups(), functions, store.now()))

    def api_jobs(request: Request) -> Response:
        try:
            _, f, before, after = _filters(request)
        except _BadRequest as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse(store.console.job_page(f, before=before, after=after, limit=_PAGE).as_dict())

    def _job_info(request: Request) -> dict[str, Any] | None:
        from ..cli import show_data

        return show_data(store, int(request.path_params["job_id"]))

    def job(request: Request) -> Response:
        info = _job_info(request)
        if info is None:
            return html(pages.message_page(view(request), "Not found", f"no job with id {request.path_params['job_id']}"), 404)
        return html(pages.job_page(view(request), info, store.now()))

    def api_job(request: Request) -> Response:
        info = _job_info(request)
        if info is None:
            return JSONResponse({"error": "no such job"}, status_code=404)
        return JSONResponse(info)

    def _graph(request: Request) -> tuple[Any, str, str]:
        job_text = request.query_params.get("job", "").strip()
        key = request.query_params.get("key", "").strip()
        if job_text.isdigit():
            return store.console.graph(job_id=int(job_text)), job_text, key
        if key:
            return store.console.graph(key_prefix=key), job_text, key
        return None, job_text, key

    def graph(request: Request) -> Response:
        found, job_text, key = _graph(request)
        return html(pages.graph_page(view(request), found, job_text, key))

    def api_graph(request: Request) -> Response:
        found, _, _ = _graph(request)
        if found is None:
            return JSONResponse({"error": "give job=ID or key=PREFIX"}, status_code=400)
        return JSONResponse(found.as_dict())

    def workers(request: Request) -> Response:
        return html(pages.workers_page(view(request), store.executors()))

    def api_workers(request: Request) -> Response:
        return JSONResponse([e.as_dict() for e in store.executors()])

    def metrics_endpoint(request: Request) -> Response:
        if registry is None:
            return Response("prometheus_client is not installed: pip install 'dbexecutor[ui]'\n", status_code=501)
        return Response(metrics.exposition(registry), media_type=metrics.CONTENT_TYPE)

    # -- sessions -----------------------------------------------------------------------------------

    def login_form(request: Request) -> Response:
        return html(pages.login_page(view(request)))

    async def login(request: Request) -> Response:
        form = await _form(request)
        cookie = guard.login(form.get("token", ""))
        if cookie is None:
            await asyncio.sleep(0.5)  # a wrong token costs a moment: guessing is slow
            return html(pages.message_page(view(request, error="wrong token"), "Log in", "The token was not accepted."), 403)
        response = RedirectResponse("/?" + urlencode({"done": "logged in: actions enabled"}), status_code=303)
        response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/")
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/?" + urlencode({"done": "logged out"}), status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- actions ------------------------------------------------------------------------------------

    async def act(request: Request) -> Response:
        form = await _form(request)
        why = guard.refuse(request.cookies, request.headers, form, request.headers.get("host", ""))
        back = _back(request)
        if why is not None:
            if "application/json" in request.headers.get("accept", ""):
                return JSONResponse({"error": why}, status_code=403)
            return html(pages.message_page(view(request, error=why), "Refused", why), 403)
        what, target = request.path_params["what"], request.path_params["target"]
        try:
            message = await run_in_threadpool(_perform, store, what, target, form)
        except _BadRequest as error:
            message, failed = str(error), True
        else:
            failed = False
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse({"error": message} if failed else {"done": message}, status_code=400 if failed else 200)
        return RedirectResponse(back + ("&" if "?" in back else "?") + urlencode({"refused" if failed else "done": message}), status_code=303)

    def not_found(request: Request, exc: Exception) -> Response:
        return html(pages.message_page(view(request), "Not found", "nothing here"), 404)

    async def security(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    routes = [
        Route("/", overview),
        Route("/jobs", jobs),
        Route("/jobs/{job_id:int}", job),
        Route("/graph", graph),
        Route("/workers", workers),
        Route("/metrics", metrics_endpoint),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/overview", api_overview),
        Route("/api/jobs", api_jobs),
        Route("/api/jobs/{job_id:int}", api_job),
        Route("/api/graph", api_graph),
        Route("/api/workers", api_workers),
        Route("/jobs/{target:int}/{what}", act, methods=["POST"]),
        Route("/groups/{target:path}/{what}", act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=_STATIC), name="static"),
    ]
    middleware = [Middleware(BaseHTTPMiddleware, dispatch=security)]
    if host in _LOOPBACK:
        # Only this machine's names: a page elsewhere that points its own name
        # at 127.0.0.1 (DNS rebinding) cannot read the UI through the browser.
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]", "::1"]))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={404: not_found})
    app.state.store = store
    return app


class _BadRequest(Exception):
    """A request whose parameters make no sense (its message says why)."""


async def _form(request: Request) -> dict[str, str]:
    """A URL-encoded form's fields (the first value of each); read without python-multipart."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _back(request: Request) -> str:
    """Where to go after an action: the page it came from (this server's path only), else the job or the overview."""
    if request.path_params.get("what") and str(request.url.path).startswith("/jobs/"):
        return f"/jobs/{int(request.path_params['target'])}"
    return "/"


def _perform(store: Store, what: str, target: str, form: dict[str, str]) -> str:
    """Run one action on the store; returns what was done, raises ``_BadRequest`` saying why not."""
    if what in ("pause", "resume"):
        if target not in {g.name for g in store.groups()}:
            raise _BadRequest(f"no group named {target}")
        if what == "pause":
            store.configure_group(target, limit=0)
            return f"group {target} paused"
        text = form.get("limit", "").strip()
        if text and not text.isdigit():
            raise _BadRequest("a limit is a whole number, or empty for none")
        limit = int(text) if text else None
        if limit == 0:
            raise _BadRequest("a limit of 0 is a pause: give a positive limit, or none")
        store.configure_group(target, limit=limit)
        return f"group {target} resumed" + ("" if limit is None else f" with a limit of {limit}")
    job_id = int(target)
    if what == "retry":
        text = form.get("retries", "0").strip() or "0"
        if not text.isdigit() or int(text) > 100:
            raise _BadRequest("further retries: a whole number from 0 to 100")
        revived, refused = store.retry([job_id], int(text), store.now())
        if job_id not in revived:
            raise _BadRequest(refused.get(job_id, f"job {job_id} was not retried"))
        others = len(revived) - 1
        return f"job {job_id} retried ({revived[job_id]})" + (f", with {others} dependent(s)" if others else "")
    if what in ("cancel", "terminate"):
        request = store.request_stop([job_id]) if what == "terminate" else None
        if request is None:
            cancelled = [f.job_id for f in store.cancel([job_id], store.now())]
            if job_id not in cancelled:
                row = store.job(job_id)
                raise _BadRequest("no such job" if row is None else f"job {job_id} is {row.state}: only waiting or ready jobs can be cancelled")
            return f"job {job_id} cancelled" + (f", with {len(cancelled) - 1} dependent(s)" if len(cancelled) > 1 else "")
        if job_id in request.cancelled:
            return f"job {job_id} had not started: cancelled"
        if job_id in request.terminating:
            return f"job {job_id}: its owner stops it at its next beat"
        raise _BadRequest(request.refused.get(job_id, "not stopped"))
    raise _BadRequest(f"unknown action {quote(what)}")

