"""A real JupyterLab 4 or Notebook 7 server on 127.0.0.1 and a headless Chromium page on it.

Used by the browser tests and ``docs/screenshot_panel.py``. Chromium is Debian's
(``playwright install`` cannot download browsers here), started with the flags that keep
it off the network.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# the notebook's kernel status as the page shows it (JupyterLab and Notebook 7 alike)
KERNEL_STATUS_JS = (
    "window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel?.status ?? null"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_notebook(path: Path, cells: list[str]) -> None:
    """A notebook of code cells (no outputs) for the default python3 kernel."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": source,
            }
            for source in cells
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def wait_http(url: str, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"the Jupyter server did not answer at {url}")


@contextlib.contextmanager
def jupyter_page(
    root: Path,
    notebook: str,
    app: str = "lab",
    viewport: tuple[int, int] = (1280, 1100),
    prepare: Callable[[Any], None] | None = None,
) -> Iterator[Any]:
    """Serve ``root`` with ``app`` ("lab" or "notebook") and open ``notebook`` in Chromium.

    ``prepare(page)`` runs before the page loads (to route its websockets, say). Yields
    the Playwright page once the notebook's kernel is idle.
    """
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise RuntimeError("Debian's chromium is needed: apt-get install chromium")
    port, token = free_port(), secrets.token_hex(16)
    env = jupyter_env(root, root / ".cfg")
    module = "jupyterlab" if app == "lab" else "notebook"
    expose = "LabApp" if app == "lab" else "JupyterNotebookApp"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--{expose}.expose_app_in_browser=True",
            "--allow-root",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}")
        path = "lab/tree" if app == "lab" else "notebooks"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                width, height = viewport
                page = browser.new_page(viewport={"width": width, "height": height})
                if prepare is not None:
                    prepare(page)
                page.goto(f"http://127.0.0.1:{port}/{path}/{notebook}?token={token}")
                page.wait_for_function("window.jupyterapp !== undefined", timeout=90_000)
                page.wait_for_selector(".jp-Notebook", timeout=90_000)
                page.wait_for_function(f"{KERNEL_STATUS_JS} === 'idle'", timeout=120_000)
                yield page
            finally:
                browser.close()
    finally:
        end_process(server)


def end_process(proc: subprocess.Popen) -> None:
    """Terminate ``proc``, killed if it has not ended within 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_all(page: Any) -> None:
    """Start running every cell of the open notebook (returns at once: the command's
    promise resolves only when the last cell ends, so it is not awaited)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


def cell_done_js(index: int) -> str:
    """JS that is true once cell ``index`` has finished running (its execution count is
    set at the execute reply; the kernel status alone can flicker)."""
    return (
        "(() => { const c = window.jupyterapp.shell.currentWidget?.content?.widgets"
        f"?.[{index}]?.model; return !!c && c.executionCount !== null; }})()"
    )


def save(page: Any) -> None:
    """Save the open notebook and wait until the server has it."""
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "!window.jupyterapp.shell.currentWidget?.context?.model?.dirty", timeout=30_000
    )


def jupyter_env(root: Path, config: Path) -> dict[str, str]:
    """The environment of a test's Jupyter server: its own config dir ``config`` and
    settings under ``root`` (no "get notified about news?" toast over the page)."""
    settings = root / ".settings"
    news = settings / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    return dict(
        os.environ,
        GLOG_v="3",
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
    )
