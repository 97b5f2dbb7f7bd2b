"""The viewer behind a proxy, over plain HTTP: the Host rule with the access token, the
relative URLs of the page, and the jupyter-server-proxy spec and entry point.

The requests below are the ones the proxies send, logged from real ones (code-server
4.100.3's ``/proxy/PORT/``, jupyter-server-proxy 4.6): the browser's Host unchanged,
jupyter-server-proxy's ``X-Forwarded-*`` marks, the proxy's own cookies and query. The
browser tests through both proxies are in ``test_proxy_browser.py``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import urllib.parse

import tomllib

from msmon_nb.viewer.access import COOKIE, TOKEN_ENV, TOKEN_HEADER, TOKEN_PARAM
from msmon_nb.viewer.jupyter import ICON, TITLE, setup_msmon_view, viewer_command
from msmon_nb.viewer.static import STATIC_DIR
from tests.conftest import ROOT
from tests.viewer.conftest import Client, msmon_cmd

REMOTE = "hub.example.org"  # what the browser sends through a remote proxy
JSP_MARKS = {"X-Forwarded-Context": "/proxy/8080", "X-Forwarded-Prefix": "/proxy/8080"}


def test_a_foreign_host_needs_the_token_however_it_is_dressed(tmp_path, serve):
    """A DNS-rebinding page is same-origin with the viewer: it can send any header a proxy
    sends, and its own cookies, but not the token."""
    server, client = serve(tmp_path)
    for host in ("evil.example:8080", REMOTE, "127.0.0.1.evil.example", "localhost.evil"):
        status, _, body = client.request("/api/runs", headers={"Host": host})
        assert status == 403, host
        error = json.loads(body)["error"]
        assert "refused" in error and f"?{TOKEN_PARAM}=" in error  # the problem and the fix
    # the page itself, opened by a person: the same refusal in words, an icon of its own
    # (else the browser asks the proxy's root for /favicon.ico: a 404 in the console)
    status, headers, body = client.request("/", headers={"Host": REMOTE})
    assert status == 403 and headers["Content-Type"].startswith("text/html")
    assert f"?{TOKEN_PARAM}=".encode() in body and b'rel="icon" href="data:,"' in body
    forged = {
        "Host": REMOTE,
        **JSP_MARKS,
        TOKEN_HEADER: "x" * 32,
        "Cookie": f"{COOKIE}={'y' * 32}; _xsrf=2|abc|def",
        "Origin": f"http://{REMOTE}",
    }
    assert client.request("/api/runs", headers=forged)[0] == 403
    assert client.request(f"/api/info?{TOKEN_PARAM}={'z' * 32}", headers={"Host": REMOTE})[0] == 403
    assert client.request("/api/stream", headers={"Host": REMOTE})[0] == 403
    # loopback names still need nothing
    assert client.request("/api/runs", headers={"Host": "localhost:9"})[0] == 200
    assert client.request("/api/runs", headers={"Host": "[::1]:8080"})[0] == 200
    assert server.gate.token not in body.decode()


def test_the_proxy_header_lets_a_foreign_host_in(tmp_path, serve):
    """jupyter-server-proxy's request_headers_override: the header, no cookie needed."""
    server, client = serve(tmp_path)
    headers = {"Host": REMOTE, **JSP_MARKS, TOKEN_HEADER: server.gate.token}
    status, resp_headers, body = client.request("/api/runs", headers=headers)
    assert status == 200 and json.loads(body) == [] and "Set-Cookie" not in resp_headers
    status, _, page = client.request("/", headers=headers)
    assert status == 200 and b"msmon view" in page


def test_the_token_once_sets_a_cookie_and_a_relative_redirect(tmp_path, serve):
    """code-server's /proxy/PORT/: ?msmon_token= once, then the cookie alone."""
    server, client = serve(tmp_path)
    token = server.gate.token
    cookies = "code-server-session=abc; _xsrf=2|1f|2e|3d"  # the proxy's own, passed through
    status, headers, _ = client.request(
        f"/?{TOKEN_PARAM}={token}&token=jupyters", headers={"Host": REMOTE, "Cookie": cookies}
    )
    assert status == 303
    # relative: the browser resolves it under the proxy's prefix; the token is gone
    assert headers["Location"] == "./?token=jupyters"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}={token};") and "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie and "Path=" not in cookie  # scoped to /proxy/PORT
    status, headers, _ = client.request(
        "/index.html?" + TOKEN_PARAM + "=" + token, headers={"Host": REMOTE}
    )
    assert status == 303 and headers["Location"] == "./"
    sent = {"Host": REMOTE, "Cookie": f"{cookies}; {COOKIE}=stale; {COOKIE}={token}"}
    status, headers, body = client.request("/api/info", headers=sent)
    assert status == 200 and "Set-Cookie" not in headers
    assert json.loads(body)["app"] == "msmon view"
    assert client.request("/app.js", headers=sent)[0] == 200
    # an API request with the token in its query is answered (and gets the cookie)
    status, headers, _ = client.request(
        f"/api/runs?{TOKEN_PARAM}={token}", headers={"Host": REMOTE}
    )
    assert status == 200 and headers["Set-Cookie"].startswith(f"{COOKIE}={token};")
    # the control POST still needs the page's X-Msmon-Token on top
    status, _, body = client.request("/api/control", method="POST", headers=sent)
    assert status == 403 and b"X-Msmon-Token" in body


def test_msmon_view_prints_the_token_and_takes_it_from_the_environment(tmp_path):
    token = "t" * 32
    env = {**os.environ, TOKEN_ENV: token}
    proc = subprocess.Popen(
        msmon_cmd("view", str(tmp_path), "--port", "0"),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        url = re.search(r"serving .* at (http://\S+)", lines[1])[1]
        port = urllib.parse.urlsplit(url).port
        assert f"/proxy/{port}/" in lines[2] and f"?{TOKEN_PARAM}={token}" in lines[2]
        client = Client("127.0.0.1", port)
        assert client.request("/api/runs", headers={"Host": REMOTE, TOKEN_HEADER: token})[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_viewer_bound_elsewhere_keeps_no_host_check(tmp_path):
    from msmon_nb.viewer.server import make_server

    server = make_server(tmp_path, host="0.0.0.0", port=0)
    try:
        assert not server.loopback_only
        assert server.gate.check(REMOTE, "", "", "").allowed
    finally:
        server.server_close()


def test_every_url_of_the_page_is_relative():
    """Behind a proxy the page lives under a prefix: an absolute path (/api/runs) would go
    to the proxy's own root. Checked in the files; the browser tests load them proxied."""
    page = (STATIC_DIR / "index.html").read_text()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert sorted(assets) == sorted(
        ["data:,", "vendor/uPlot.min.css", "vendor/chart.css", "app.css",
         "vendor/uPlot.iife.min.js", "vendor/chart.js", "vendor/heatmap.js", "app.js"]
    )  # fmt: skip
    code = (STATIC_DIR / "app.js").read_text()
    code = re.sub(r"//[^\n]*", "", code)  # comments name routes as /api/...
    urls = re.findall(r"""(?:fetch|getJSON|EventSource)\(\s*["`']([^"`']*)""", code)
    urls += re.findall(r"""return\s+`(api/[^`?]*)""", code)
    # the regexes found the page's calls (each route it uses), and every one is relative
    routes = {re.split(r"[?$]", u)[0] for u in urls}
    assert {"api/runs", "api/stream", "api/scalars", "api/alerts", "api/info"} <= routes, urls
    assert all(u.startswith("api/") for u in urls), urls
    assert not re.search(r"""["`']/(?:api|vendor|app)""", code)


def test_the_jupyter_server_proxy_spec():
    spec = setup_msmon_view()
    assert spec["absolute_url"] is False
    assert spec["launcher_entry"]["title"] == TITLE == "msmon viewer"
    assert spec["launcher_entry"]["icon_path"] == str(ICON) and ICON.is_file()
    assert ICON.read_text().lstrip().startswith("<svg")
    token = spec["environment"][TOKEN_ENV]
    assert spec["request_headers_override"] == {TOKEN_HEADER: token} and len(token) >= 32
    assert setup_msmon_view()["environment"][TOKEN_ENV] != token  # new at every start
    command = spec["command"](port=8123)
    assert command == viewer_command(8123)
    assert command[:4] == [sys.executable, "-m", "msmon_nb.cli", "view"]
    assert command[-2:] == ["--port", "8123"]
    # the spec is what jupyter-server-proxy itself accepts
    from jupyter_server_proxy.config import ServerProxy  # the dev extra has it

    (process,) = ServerProxy(servers={"msmon": spec}).servers.values()
    assert process.name == "msmon" and process.launcher_entry.title == TITLE
    # importing the package does not need jupyter-server-proxy
    probe = "import sys, msmon_nb.viewer.jupyter, msmon_nb.viewer.server; "
    probe += "print('jupyter_server_proxy' in sys.modules, 'jupyter_server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_entry_point_names_the_spec():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = "msmon_nb.viewer.jupyter:setup_msmon_view"
    assert meta["entry-points"]["jupyter_serverproxy_servers"] == {"msmon": target}
    assert any(
        r.startswith("jupyter-server-proxy") for r in meta["optional-dependencies"]["jupyter"]
    )
    assert set(meta["optional-dependencies"]["jupyter"]) <= set(
        meta["optional-dependencies"]["dev"]
    )
    # installed from this checkout (CI: pip install -e .): the real entry point
    dist = importlib.metadata.distribution("msmon_nb")
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("url") == ROOT.as_uri():
        eps = importlib.metadata.entry_points(group="jupyter_serverproxy_servers")
        assert eps["msmon"].value == target and eps["msmon"].load() is setup_msmon_view
