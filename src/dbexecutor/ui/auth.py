"""Who may act in the UI: a login with the token, a session cookie, and a CSRF token in every form.

::

    POST /login (token) ──► cookie dbx_session = nonce.HMAC(key, nonce)   HttpOnly, SameSite=Strict
    every form ──────────► hidden csrf = HMAC(key, "csrf:" + nonce)
    POST action ─────────► cookie valid, csrf matches, Origin (if sent) is this server

The key is random per process: restarting the UI ends every session. A
script may instead send ``Authorization: Bearer <token>``, which no browser
adds on its own to a request another site makes, so it needs no CSRF token.
Without a token nothing is allowed, whatever a request carries.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["Guard", "COOKIE"]

COOKIE = "dbx_session"


class Guard:
    """Checks logins, sessions and CSRF tokens for one UI process."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._key = os.urandom(32)

    @property
    def enabled(self) -> bool:
        """Whether actions are possible at all (the UI was started with a token)."""
        return self._token is not None

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def login(self, given: str) -> str | None:
        """A new session cookie's value if ``given`` is the token, else None (compared in constant time)."""
        if self._token is None or not hmac.compare_digest(given.encode(), self._token.encode()):
            return None
        nonce = secrets.token_hex(16)
        return f"{nonce}.{self._sign(nonce)}"

    def session(self, cookies: Mapping[str, str]) -> str | None:
        """The session nonce of a valid session cookie, else None."""
        if self._token is None:
            return None
        value = cookies.get(COOKIE, "")
        nonce, _, signature = value.partition(".")
        if not nonce or not hmac.compare_digest(signature, self._sign(nonce)):
            return None
        return nonce

    def csrf(self, nonce: str) -> str:
        """The CSRF token of a session, put in its forms."""
        return self._sign("csrf:" + nonce)

    def bearer(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries ``Authorization: Bearer <token>``."""
        if self._token is None:
            return False
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token.encode())

    def refuse(self, cookies: Mapping[str, str], headers: Mapping[str, str], form: Mapping[str, str], host: str) -> str | None:
        """Why a POST that would change something is refused, or None if it may go ahead."""
        if self._token is None:
            return "this UI is read-only: start it with a token to allow actions"
        if self.bearer(headers):
            return None
        nonce = self.session(cookies)
        if nonce is None:
            return "log in first"
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf(nonce)):
            return "the form's CSRF token is missing or wrong: reload the page and try again"
        origin = headers.get("origin") or headers.get("referer")
        if origin and urlsplit(origin).netloc != host:
            return "the request came from another site"
        return None
