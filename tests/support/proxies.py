"""The viewer behind real proxies: JupyterLab with jupyter-server-proxy, and code-server's
``/proxy/PORT/``, opened in headless Chromium under a *remote* host name.

Used by ``tests/viewer/test_proxy_browser.py`` and ``docs/screenshot_proxy.py``. Chromium
resolves ``REMOTE_HOST`` to 127.0.0.1 (``--host-resolver-rules``), so the proxies see, and
forward, a ``Host`` that is not a loopback name: what a browser sends to a JupyterHub or a
remote code-server. JupyterLab gets ``allow_remote_access`` as JupyterHub's single-user
servers do. jupyter-server-proxy finds the viewer through the package's entry point when
msmon_nb is installed with it (CI installs the checkout); otherwise (an install made before
the entry point existed) it is configured through ``setup_msmon_view``, the function the
entry point names, so the launcher holds exactly one "msmon viewer" card.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.jupyter_app import (
    CHROMIUM_ARGS,
    end_process,
    free_port,
    jupyter_env,
    wait_http,
)
from tests.support.livewriter import start_writer

REMOTE_HOST = "msmon-remote.test"
ROOT = Path(__file__).resolve().parents[2]
CODE_SERVER = os.environ.get("MSMON_CODE_SERVER") or shutil.which("code-server")
LOCAL_CODE_SERVER = ROOT / "build" / "code-server" / "node_modules" / ".bin" / "code-server"
if not CODE_SERVER and LOCAL_CODE_SERVER.exists():  # install_code_server.sh build/code-server
    CODE_SERVER = str(LOCAL_CODE_SERVER)
# set by .ci/run, which installs code-server beside the tests: "ok" or why not
INSTALL_STATUS = os.environ.get("MSMON_CODE_SERVER_STATUS")


@contextlib.contextmanager
def live_run(run_dir: Path, pause: float = 0.3) -> Iterator[subprocess.Popen]:
    """A process writing ``run_dir`` until the block ends; its first flush is done."""
    proc = start_writer(run_dir, pause, "gentle")
    try:
        proc.stdout.readline()
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) that resolves ``REMOTE_HOST`` to 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        raise RuntimeError("Debian's chromium is needed: apt-get install chromium")
    args = [*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REMOTE_HOST} 127.0.0.1"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=args)
        try:
            yield browser
        finally:
            browser.close()


def _entry_point_installed() -> bool:
    """Whether jupyter-server-proxy will find ``msmon`` among the installed entry points."""
    from importlib.metadata import entry_points

    return any(ep.name == "msmon" for ep in entry_points(group="jupyter_serverproxy_servers"))


@contextlib.contextmanager
def jupyter_lab(root: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab serving ``root`` with the viewer registered in jupyter-server-proxy:
    yields (the lab's base URL under ``REMOTE_HOST``, its login token)."""
    port, token = free_port(), secrets.token_hex(16)
    config = root / ".cfg"
    config.mkdir(parents=True, exist_ok=True)
    if not _entry_point_installed():
        (config / "jupyter_server_config.py").write_text(
            "from msmon_nb.viewer.jupyter import setup_msmon_view\n"
            "c.ServerProxy.servers = {'msmon': setup_msmon_view()}\n"
        )
    env = jupyter_env(root, config)
    with open(root / "jupyter.log", "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", "--ServerApp.allow_remote_access=True",
             "--allow-root"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root,
        )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}")
        yield f"http://{REMOTE_HOST}:{port}/", token
    finally:
        end_process(server)


@contextlib.contextmanager
def viewer(base: Path) -> Iterator[tuple[int, str]]:
    """``msmon view BASE --port 0`` (the real command): yields (its port, the access token
    it printed for proxies)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "msmon_nb.cli", "view", str(base), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        port = int(re.search(r"serving .* at http://127\.0\.0\.1:(\d+)/", "".join(lines))[1])
        token = re.search(r"\?msmon_token=(\S+)", lines[-1])[1]
        yield port, token
    finally:
        end_process(proc)


def wait_for_code_server_install(timeout: float = 500) -> None:
    """Under CI, wait for .ci/run's install of code-server (beside the tests) to end."""
    if not INSTALL_STATUS:
        return
    status = Path(INSTALL_STATUS)
    deadline = time.monotonic() + timeout
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(2)
    assert status.exists(), "code-server's install did not end in time"
    assert status.read_text().strip() == "ok", status.read_text()


@contextlib.contextmanager
def code_server(root: Path) -> Iterator[str]:
    """code-server (no login) on a free port: yields its base URL under ``REMOTE_HOST``."""
    wait_for_code_server_install()
    if not CODE_SERVER:
        raise RuntimeError("no code-server: tests/vscode/install_code_server.sh build/code-server")
    port = free_port()
    data = root / "cs-data"
    (data / "User").mkdir(parents=True, exist_ok=True)
    config = root / "cs-config.yaml"
    config.write_text(f"bind-addr: 127.0.0.1:{port}\nauth: none\ncert: false\n")
    with open(root / "code-server.log", "w") as log:
        proc = subprocess.Popen(
            [CODE_SERVER, "--config", str(config), "--user-data-dir", str(data),
             "--extensions-dir", str(root / "cs-ext"), "--disable-telemetry",
             "--disable-update-check", str(root)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError((root / "code-server.log").read_text()) from None
                time.sleep(0.3)
        yield f"http://{REMOTE_HOST}:{port}/"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
