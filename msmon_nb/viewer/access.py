"""Who may talk to the viewer: the loopback rule against DNS rebinding, and the one way a
proxy gets past it.

The threat: the viewer binds 127.0.0.1, but a web page the user visits can make its own
name resolve to 127.0.0.1 (DNS rebinding) and then read the viewer as *its* origin; such a
request carries the attacker's name in ``Host``. So a request whose ``Host`` is not a
loopback name is refused, unless it proves it knows the viewer's access token.

What the proxies send (read in their source, and logged from real requests: code-server
4.100.3's ``/proxy/PORT/`` and jupyter-server-proxy 4.6's ``/proxy/PORT/`` and named
servers, tests/viewer/test_proxy.py):

- both connect from the loopback address and pass the browser's ``Host`` on unchanged
  (``hub.example.org``, ``myserver:8443``): behind a remote proxy it is never loopback;
- code-server (``http-proxy``, no ``xfwd``) adds nothing; jupyter-server-proxy adds
  ``X-Forwarded-Context``, ``X-ProxyContextPath`` and ``X-Forwarded-Prefix``;
- both pass ``Origin``, ``Cookie`` and the query string through (Jupyter's own ``?token=``
  too, hence our parameter's distinct name).

Neither a loopback peer nor those marks prove anything: a rebinding page connects from the
same browser on the same machine, and being same-origin with the viewer it may set any
header it likes. Only a secret it cannot know does. The token reaches an honest client in
one of three ways:

- ``X-Msmon-View-Token`` header: jupyter-server-proxy adds it to every request it forwards
  to a viewer it started (``viewer.jupyter``, ``request_headers_override``); the viewer
  takes the same token from ``MSMON_VIEW_TOKEN``. The browser never sees it;
- ``?msmon_token=`` once (``msmon view`` prints the token): the viewer answers with an
  ``HttpOnly`` cookie scoped to the proxied path and redirects to ``./``, so the token
  leaves the address bar;
- that cookie on every later request.

Why that is safe: a rebinding page's requests go to the attacker's host name, for which the
browser holds no cookie of ours, and it cannot read the token (printed on the terminal;
served by ``/api/info`` only to requests already let in). ``SameSite=Lax`` rather than
Strict: the first request after the redirect must carry it even when the link was opened
from another app; cross-site pages still cannot read answers (no CORS) nor POST a control
(it needs ``X-Msmon-Token``). A viewer bound to a non-loopback address has no Host check
at all (``msmon view`` warns that it has no login).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import urllib.parse
from dataclasses import dataclass

TOKEN_ENV = "MSMON_VIEW_TOKEN"
TOKEN_HEADER = "X-Msmon-View-Token"
TOKEN_PARAM = "msmon_token"
COOKIE = "msmon_view"
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8080`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def access_token() -> str:
    """The token of this viewer: ``MSMON_VIEW_TOKEN`` when set (jupyter-server-proxy sets
    it and sends the same in a header), else a new random one."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    return given if len(given) >= 16 else secrets.token_urlsafe(24)


def _same(given: str | None, token: str) -> bool:
    return bool(given) and hmac.compare_digest(str(given).encode(), token.encode())


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one request."""

    allowed: bool
    # the request proved itself with ?msmon_token=: answer with the cookie
    set_cookie: bool = False
    error: str = ""


class Gate:
    """The Host rule of one viewer (see the module docstring for why it is safe)."""

    def __init__(self, loopback_only: bool, token: str) -> None:
        self.loopback_only = loopback_only
        self.token = token

    def check(self, host_header: str, token_header: str, cookie_header: str, query: str) -> Verdict:
        """Let in loopback Hosts, and any Host that shows the token (header, cookie, or the
        ``msmon_token`` query parameter, which also earns the cookie)."""
        host = host_name(host_header)
        if not self.loopback_only or is_loopback(host):
            return Verdict(True)
        cookies = self._cookies(cookie_header)
        if _same(token_header, self.token) or any(_same(c, self.token) for c in cookies):
            return Verdict(True)
        given = urllib.parse.parse_qs(query).get(TOKEN_PARAM, [None])[-1]
        if _same(given, self.token):
            return Verdict(True, set_cookie=True)
        return Verdict(
            False,
            error=(
                f"Host {host!r} refused: the viewer is local-only (loopback names). Through a "
                f"proxy (code-server /proxy/PORT/, JupyterLab /proxy/PORT/), open it once "
                f"with ?{TOKEN_PARAM}=TOKEN (the token msmon view printed); in JupyterLab "
                "the launcher's 'msmon viewer' (<lab>/msmon/) needs none"
            ),
        )

    def cookie(self) -> str:
        """The ``Set-Cookie`` value: no Path, so the browser scopes it to the proxied
        directory it was set from (``/proxy/8080``), not to the proxy's whole site."""
        return f"{COOKIE}={self.token}; HttpOnly; SameSite=Lax"

    @staticmethod
    def _cookies(header: str) -> list[str]:
        """Our cookie's values (a browser may hold one per proxied path); split by hand,
        because the proxy's own cookies (Jupyter's ``_xsrf``, code-server's session) are not
        all valid for ``http.cookies``, which stops at the first one it dislikes."""
        out = []
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                out.append(value)
        return out


def without_token(query: str) -> str:
    """``query`` without the ``msmon_token`` parameter (for the redirect that hides it)."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return urllib.parse.urlencode([(k, v) for k, v in pairs if k != TOKEN_PARAM])
