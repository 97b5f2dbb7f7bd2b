"""Render the live panel in a real JupyterLab, in headless Chromium, and save a screenshot.

    python docs/screenshot_panel.py [--out docs/panel.png] [--steps 300]

Starts JupyterLab on 127.0.0.1 with a throwaway notebook that trains the demo model under
``%%msmonitor``, runs it with Playwright driving Debian's chromium (``playwright
install`` cannot download browsers here), waits for the run to finish and captures the
panel. Needs the dev extra (jupyterlab, playwright) and ``/usr/bin/chromium``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

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

NOTEBOOK_CELLS = [
    "%load_ext msmon_nb",
    "import os\nos.environ['GLOG_v'] = '3'\nimport mindspore as ms\n"
    "from msmon_nb.demo import batches, build, make_data\n"
    "STEPS = {steps}\ndata = make_data()\nnet, loss_fn, opt = build(steps=STEPS)\n"
    "grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)",
    "%%msmonitor --dir {base} --run demo --refresh 0.2\n"
    "for x, y in batches(data, 64, STEPS):\n"
    "    loss, grads = grad_fn(x, y)\n"
    "    opt(grads)",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_notebook(path: Path, base: Path, steps: int) -> None:
    cells = [
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": cell.format(base=base, steps=steps),
        }
        for cell in NOTEBOOK_CELLS
    ]
    nb = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def wait_http(url: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer at {url}")


def screenshot(out: Path, steps: int = 300, timeout: float = 300) -> Path:
    """Run the notebook in JupyterLab and save the panel's screenshot to ``out``."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_notebook(root / "panel.ipynb", root / "summary", steps)
        port, token = free_port(), secrets.token_hex(16)
        settings = root / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        # no "get notified about news?" toast over the screenshot
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        env = dict(
            os.environ,
            GLOG_v="3",
            JUPYTER_CONFIG_DIR=str(root / "cfg"),
            JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
        )
        lab = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                "--allow-root",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/api/status?token={token}")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 1100})
                page.goto(f"http://127.0.0.1:{port}/lab/tree/panel.ipynb?token={token}")
                page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
                page.wait_for_selector(".jp-Notebook", timeout=60_000)
                page.wait_for_function(
                    "window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel"
                    "?.status === 'idle'",
                    timeout=120_000,
                )
                page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
                panel = page.locator(".widget-vbox").first
                panel.wait_for(timeout=120_000)
                page.wait_for_function(
                    "[...document.querySelectorAll('.widget-html-content')]"
                    ".some(e => e.textContent.includes('finished'))",
                    timeout=timeout * 1000,
                )
                time.sleep(1.0)  # let the final image land
                panel.scroll_into_view_if_needed()
                out.parent.mkdir(parents=True, exist_ok=True)
                panel.screenshot(path=str(out))
                browser.close()
        finally:
            lab.terminate()
            lab.wait(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "panel.png")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    print(f"saved {screenshot(args.out, args.steps)}")


if __name__ == "__main__":
    main()
