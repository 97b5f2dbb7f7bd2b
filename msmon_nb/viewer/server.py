"""``msmon view``: the HTTP server (stdlib ``ThreadingHTTPServer``), its watcher thread.

Why the standard library: the viewer serves a handful of JSON routes, a few static files
and one event stream to a few local browsers; a framework would add dependencies and
start-up time and earn nothing here. One thread per connection is fine at that scale
(tested with 50 concurrent clients while a run is being written).

Security: binds 127.0.0.1 unless told otherwise; when bound to loopback it also refuses
requests whose ``Host`` header is not a loopback name, so a web page the user visits
cannot reach the viewer through DNS rebinding, unless the request shows the viewer's
access token (``access.py``: the header jupyter-server-proxy adds, or the cookie that
``?msmon_token=`` sets behind code-server's ``/proxy/PORT/``; a rebinding page knows
neither, and the browser keeps the cookie for the proxy's host name only); GET (and
HEAD: the same answer without its body), plus one POST (``/api/control``: a command of
``rundir.control.SPECS`` for a live run) that needs the
server's token in an ``X-Msmon-Token`` header, which only this origin's page can read;
static files come from a whitelist (``static.py``); run names are looked up among the
discovered runs, never joined into paths, and a control goes only to a run dir proven to
be inside the base. Every URL the page uses is relative and every redirect is ``./``, so
the viewer works under any path prefix a proxy puts in front of it.
"""

from __future__ import annotations

import hmac
import html
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

from msmon_nb.rundir.control import ControlError, command_list, live_ranks, send, wait_for_ack
from msmon_nb.viewer import api
from msmon_nb.viewer.access import (
    TOKEN_HEADER,
    TOKEN_PARAM,
    Gate,
    access_token,
    is_loopback,
    without_token,
)
from msmon_nb.viewer.sse import Broadcaster
from msmon_nb.viewer.static import MissingAsset, StaticFile, static_files
from msmon_nb.viewer.store import RunStore, UnknownRun

log = logging.getLogger(__name__)

POLL_SECS = 0.5  # watcher period: new points reach the page well within 2 s
PING_SECS = 15.0
CONTROL_WAIT_SECS = 10.0  # a control POST waits this long for the monitor's ack
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'"
)


class ViewerServer(ThreadingHTTPServer):
    """The viewer over one base dir: HTTP server, run store, watcher, event fan-out."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, base: str | os.PathLike[str], host: str, port: int, poll_secs: float):
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.base = Path(base).resolve()
        self.store = RunStore(self.base)
        self.events = Broadcaster()
        self.files: dict[str, StaticFile] = static_files()
        self.poll_secs = poll_secs
        self.loopback_only = is_loopback(host)
        # asked for by the page (/api/info) and sent back with each control POST: a page
        # of another origin cannot read it (no CORS), and its custom header would need a
        # preflight this server never grants
        self.token = secrets.token_urlsafe(24)
        # lets a proxied request with a foreign Host in (access.py); printed at start
        self.gate = Gate(self.loopback_only, access_token())
        self.closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._serving: threading.Thread | None = None
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        """The address to open in a browser."""
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def start_watcher(self) -> None:
        """Start the thread that tails runs and publishes events."""
        self.store.scan()
        self._watcher = threading.Thread(target=self._watch, name="msmon-view-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self.closing.wait(self.poll_secs):
            try:
                for kind, data in self.store.poll():
                    self.events.publish(kind, data)
            except Exception:  # thread boundary: keep watching, say why once per failure
                log.exception("msmon view: watching %s failed; retrying", self.base)

    def start(self) -> None:
        """Serve from a background thread (tests, ``msmon demo``); ``stop()`` ends it."""
        self.start_watcher()
        self._serving = threading.Thread(
            target=self.serve_forever, name="msmon-view", kwargs={"poll_interval": 0.2}
        )
        self._serving.daemon = True
        self._serving.start()

    def stop(self) -> None:
        """Stop serving, release event-stream clients, close the socket."""
        self.closing.set()
        self.events.close()
        self.store.close()
        if self._serving is not None:
            self.shutdown()
            self._serving.join(5)
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    """One connection: GET of the API, the event stream, or a whitelisted static file."""

    server: ViewerServer
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections give their thread back
    server_version = "msmon-view"
    _cookie = ""  # a Set-Cookie for this request's answer (access.Gate.cookie)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._answer(self._get)

    # HEAD is GET without the body (RFC 9110 9.3.2): link checkers and proxies probe with
    # it, and the stdlib's answer to a method without a handler is a 501
    do_HEAD = do_GET

    def _answer(self, handle: Callable[[], None]) -> None:
        """Run one request's handler: a client gone is not an error, anything else is a
        500 (logged) and the server keeps serving."""
        try:
            handle()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # request boundary: answer 500, keep serving
            log.exception("msmon view: %s %s failed", self.command, self.path)
            self.close_connection = True
            try:
                self._json(500, {"error": f"internal error: {exc}"})
            except OSError:
                pass

    def _refuse(self) -> None:
        self._json(
            405, {"error": "only GET (or HEAD), and POST /api/control"}, allow="GET, HEAD, POST"
        )

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def do_POST(self) -> None:
        self._answer(self._post)

    def _local(self) -> bool:
        """False (and a 403 sent) for a request the Host rule refuses (``access.py``);
        a page request that showed ``?msmon_token=`` is answered by the redirect that
        sets the cookie and drops the token from the address (False too)."""
        self._cookie = ""  # a keep-alive connection's earlier request may have set one
        target = urllib.parse.urlsplit(self.path)
        verdict = self.server.gate.check(
            self.headers.get("Host", ""),
            self.headers.get(TOKEN_HEADER, ""),
            self.headers.get("Cookie", ""),
            target.query,
        )
        page = self.command in ("GET", "HEAD") and target.path in ("/", "/index.html")
        if not verdict.allowed:
            if page:
                self._refused_page(verdict.error)  # a person opened the page: words
            else:
                self._json(403, {"error": verdict.error})
            return False
        if verdict.set_cookie:
            self._cookie = self.server.gate.cookie()
            if page:
                # relative, so it stays under the proxy's prefix; 303: GET, no body
                rest = without_token(target.query)
                self._send(
                    303, b"", "text/plain", {"Location": "./" + (f"?{rest}" if rest else "")}
                )
                return False
        return True

    def _post(self) -> None:
        """``POST /api/control`` ``{run, cmd, arg}``: the panel's buttons for a live run
        (``rundir.control``): token-checked, only for runs the listing has under the base
        dir; answered once the monitor acknowledges (or 202 while it is mid-step)."""
        if not self._local():
            return
        if urllib.parse.urlsplit(self.path).path != "/api/control":
            self._refuse()
            return
        token = self.headers.get("X-Msmon-Token", "")
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            self._json(403, {"error": "missing or wrong X-Msmon-Token (reload the page)"})
            return
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            self._json(415, {"error": "send JSON: Content-Type: application/json"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._json(400, {"error": "Content-Length is not a number"})
            return
        if not 0 < length <= 4096:
            self._json(413, {"error": "a control request is a small JSON object"})
            return
        try:
            body = json.loads(self.rfile.read(length))
            name, cmd, arg = body["run"], body["cmd"], body.get("arg")
        except (ValueError, KeyError, TypeError):
            self._json(400, {"error": 'expected {"run": NAME, "cmd": "pause", "arg": null}'})
            return
        try:
            run_dir = self.server.store.run_dir(str(name))
        except UnknownRun:
            self._json(404, {"error": f"no run {name!r} under {self.server.base}"})
            return
        try:
            command = send(run_dir, cmd, arg, source="msmon view")
        except ControlError as exc:
            self._json(409, {"error": str(exc)})
            return
        ranks = live_ranks(run_dir)  # a distributed run: each live rank acknowledges
        acks = wait_for_ack(run_dir, command, timeout=CONTROL_WAIT_SECS, ranks=ranks)
        if not acks:
            message = "queued: the monitor acts at its next step boundary"
            self._json(202, {"ok": True, "queued": True, "message": message, "id": command.id})
            return
        body = {"ok": all(a.get("ok") for a in acks), "acks": acks, "id": command.id}
        missing = sorted(ranks - {a.get("rank") for a in acks})
        if missing:  # still queued for them: they act at their next step boundary
            body["waiting_for_ranks"] = missing
        self._json(200, body)

    def _get(self) -> None:
        if not self._local():
            return
        target = urllib.parse.urlsplit(self.path)
        path, query = target.path, urllib.parse.parse_qs(target.query, keep_blank_values=True)
        route = api.ROUTES.get(path)
        if route is not None:
            try:
                body = route(self.server.store, query)
            except api.ApiError as exc:
                self._json(exc.status, {"error": exc.message})
                return
            self._json(200, body)
        elif path == "/api/stream":
            self._stream()
        elif path == "/api/info":
            info = {"app": "msmon view", "base": str(self.server.base), "pid": os.getpid()}
            # the page builds its control buttons from the command table, not a copy
            info["commands"] = command_list()
            self._json(200, {**info, "control_token": self.server.token})
        elif (static := self.server.files.get(path)) is not None:
            self._static(static)
        else:
            self._json(404, {"error": f"not found: {path}"})

    def _refused_page(self, error: str) -> None:
        """The 403 of the page itself, as a page: the refusal and its fix in words (a
        browser shows JSON as raw text), with an icon of its own so that the browser
        does not ask the proxy's root for ``/favicon.ico`` (a 404 in the console)."""
        body = (
            '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
            "<title>msmon view: refused</title></head><body><h1>msmon view: refused</h1>"
            f"<p>{html.escape(error)}</p></body></html>"
        ).encode()
        self._send(403, body, "text/html; charset=utf-8", {"Cache-Control": "no-store"})

    def _json(self, status: int, obj: Any, **headers: str) -> None:
        body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
        self._send(status, body, "application/json", {"Cache-Control": "no-store", **headers})

    def _static(self, static: StaticFile) -> None:
        """A whitelisted file, ``no-cache`` (``static.py`` says why) with its ETag: the
        browser asks each time and an unchanged file is a bodiless 304."""
        gzip_ok = "gzip" in self.headers.get("Accept-Encoding", "")
        body, gzipped = static.body(gzip_ok)
        headers = {
            "Cache-Control": "no-cache",
            "ETag": static.etag,
            "Vary": "Accept-Encoding",
            "Content-Security-Policy": _CSP,
        }
        asked = self.headers.get("If-None-Match", "")
        if static.etag in (tag.strip() for tag in asked.split(",")) or asked.strip() == "*":
            self._send(304, b"", static.content_type, headers, length=False)
            return
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, static.content_type, headers)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str],
        length: bool = True,
    ) -> None:
        """One answer; a HEAD gets the headers a GET would (its Content-Length too) and
        no body. ``length``: False for a 304, which has no body whatever its GET's is."""
        self.send_response(status)
        if self._cookie:
            self.send_header("Set-Cookie", self._cookie)
        self.send_header("Content-Type", content_type)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in headers.items():
            self.send_header("ETag" if name == "ETag" else name.replace("_", "-").title(), value)
        self.end_headers()
        if self.command != "HEAD" and status != 304:
            self.wfile.write(body)

    def _stream(self) -> None:
        """Server-sent events until the client leaves or the server stops.

        A reconnecting browser sends the id of the last event it saw (``Last-Event-ID``):
        the stream goes on right after it when every later event is still held, and the
        ``hello`` says so (``resumed: true``); otherwise it starts at the newest event and
        ``resumed: false`` tells a page that was connected before to reload what it
        shows. ``hello`` carries an id too, so a page that lost its first connection
        before any event still resumes where that connection began."""
        self.close_connection = True
        events = self.server.events
        last_id = self.headers.get("Last-Event-ID")
        resumed = events.resume(last_id) if last_id else None
        cursor = events.seq if resumed is None else resumed
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        # no-transform: code-server's proxy gzips what it forwards (express `compression`)
        # and would hold the events in its buffer; it, like any proxy that follows RFC
        # 9111, leaves a no-transform answer alone. X-Accel-Buffering: nginx, which often
        # fronts JupyterHub, buffers answers unless told not to
        self.send_header("Cache-Control", "no-store, no-transform")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Connection", "close")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command == "HEAD":
            return
        self._hello(cursor, resumed is not None, retry=True)
        while not self.server.closing.is_set():
            batch = events.wait(cursor, PING_SECS)
            if not batch:
                self.wfile.write(b": ping\n\n")
            elif batch[0][0] > cursor + 1:  # fell behind by more than the events held
                cursor = events.seq
                self._hello(cursor, False)
                continue
            for seq, kind, data in batch:
                payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
                line = f"id: {events.event_id(seq)}\nevent: {kind}\ndata: {payload}\n\n"
                self.wfile.write(line.encode())
                cursor = seq
            self.wfile.flush()

    def _hello(self, cursor: int, resumed: bool, retry: bool = False) -> None:
        """The stream's ``hello``: where it starts, and whether that is right after the
        client's last event (when not, the page reloads what it shows)."""
        events = self.server.events
        hello = json.dumps({"base": str(self.server.base), "seq": cursor, "resumed": resumed})
        head = "retry: 1000\n" if retry else ""
        text = f"{head}id: {events.event_id(cursor)}\nevent: hello\ndata: {hello}\n\n"
        self.wfile.write(text.encode())
        self.wfile.flush()


def make_server(
    base: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8080,
    poll_secs: float = POLL_SECS,
) -> ViewerServer:
    """A bound (not yet serving) viewer; ``port=0`` picks a free port."""
    return ViewerServer(base, host, port, poll_secs)


def _already_serving(host: str, port: int, base: Path) -> str | None:
    """The URL of an msmon viewer of ``base`` already listening there, else None."""
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    try:
        with urllib.request.urlopen(url + "api/info", timeout=2) as resp:
            info = json.load(resp)
    except (OSError, ValueError):
        return None
    if info.get("app") == "msmon view" and info.get("base") == str(base):
        return url
    return None


def serve(
    base: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8080,
    out: TextIO = sys.stdout,
    any_port_if_taken: bool = False,
) -> int:
    """Run the viewer until Ctrl-C; the exit status of ``msmon view``.

    Prints ``msmon view: starting ...`` then ``msmon view: serving BASE at URL`` (or
    ``already serving`` when a viewer of the same base holds the port): VSCode's
    background task waits for those lines; an error line ends with ``[BASE]``, the dir
    VSCode's problem matcher files the problem under. ``any_port_if_taken`` (``msmon demo``) falls
    back to a free port when another program holds ``port``.
    """
    base_path = Path(base).resolve()
    print(f"msmon view: starting on {base_path}", file=out, flush=True)
    try:
        server = make_server(base_path, host, port)
    except MissingAsset as exc:
        print(f"msmon view: error: {exc} [{base_path}]", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        url = _already_serving(host, port, base_path) if port else None
        if url is not None:
            print(f"msmon view: already serving {base_path} at {url}", file=out, flush=True)
            return 0
        if any_port_if_taken and port:
            return serve(base_path, host, 0, out)
        print(
            f"msmon view: error: cannot listen on {host}:{port}: {exc.strerror or exc}; "
            f"try another --port (0 picks a free one) [{base_path}]",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if not server.loopback_only:
        print(
            f"msmon view: warning: listening on {host}, not loopback; the viewer has no "
            "login, so anyone who can reach this address can read your runs",
            file=sys.stderr,
            flush=True,
        )
    if not base_path.is_dir():
        print(
            f"msmon view: {base_path} does not exist yet; runs appear as they are written",
            file=out,
        )
    if threading.current_thread() is threading.main_thread():
        # After MindSpore ran in this process (``msmon demo``) its native SIGINT handler
        # ends the process without unwinding; Ctrl-C must stop the server cleanly instead.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    server.start_watcher()
    print(f"msmon view: serving {base_path} at {server.url}", file=out, flush=True)
    if server.loopback_only:
        print(
            f"msmon view: through a proxy (code-server or JupyterLab /proxy/{server.server_port}/)"
            f" open it once with ?{TOKEN_PARAM}={server.gate.token}",
            file=out,
            flush=True,
        )
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        print("msmon view: stopped", file=out, flush=True)
    finally:
        server.closing.set()
        server.events.close()
        server.store.close()
        server.server_close()
    return 0
