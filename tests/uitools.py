"""Serving the web UI for a test: a real uvicorn server on a free loopback port, and a small HTTP client with cookies."""

from __future__ import annotations

import contextlib
import http.cookiejar
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

TOKEN = "test-token-0123456789"


def free_port() -> int:
    """A TCP port nobody listens on right now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(store: Any, token: str | None = None, refresh: float = 2.0) -> Iterator[str]:
    """Run the UI for ``store`` in a thread; yields its base URL (``http://127.0.0.1:PORT``)."""
    uvicorn = pytest.importorskip("uvicorn")
    from dbexecutor.ui.app import create_app

    port = free_port()
    config = uvicorn.Config(create_app(store, token=token, refresh=refresh), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ui-test-server", daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < end, "the UI server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Reply:
    """An HTTP response: status, body text, headers."""

    status: int
    text: str
    headers: dict[str, str]

    def csrf(self) -> str:
        """The CSRF token of the first form on the page."""
        found = re.search(r'name="csrf" value="([^"]+)"', self.text)
        assert found, "no form with a CSRF token on this page"
        return found.group(1)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    """A browser-like client: keeps cookies, does not follow redirects (tests look at them)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self._open = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()).open

    def request(self, method: str, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Reply:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self._open(req, timeout=30) as r:
                return Reply(r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()})
        except urllib.error.HTTPError as error:
            return Reply(error.code, error.read().decode(), {k.lower(): v for k, v in error.headers.items()})

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, form: dict[str, str] | None = None, **kw: Any) -> Reply:
        return self.request("POST", path, form or {}, **kw)

    def login(self, token: str = TOKEN) -> Reply:
        reply = self.post("/login", {"token": token})
        assert reply.status == 303, (reply.status, reply.text[:500])
        return reply
