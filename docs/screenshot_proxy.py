"""Screenshot ``msmon view`` through the two proxies a remote user reaches it by, with a live run.

    python docs/screenshot_proxy.py [--out-dir docs] [--after 6]

Writes ``viewer-jupyterlab.png`` (JupyterLab's launcher card "msmon viewer" opened:
``<lab>/msmon/``, jupyter-server-proxy) and ``viewer-code-server.png`` (code-server's
``/proxy/PORT/``, opened once with ``?msmon_token=``). Both are taken in headless Chromium
under a non-loopback host name, as from another machine (``tests/support/proxies.py``, the
helpers the browser tests use). Needs the dev extra (jupyterlab, jupyter-server-proxy,
playwright), ``/usr/bin/chromium`` and code-server
(``bash tests/vscode/install_code_server.sh build/code-server``). Run from the repository
root.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.proxies import chromium, code_server, jupyter_lab, live_run, viewer

CHART = "document.querySelector(\"#charts .msmon-chart[data-msmon-tag='train/loss']\")"


def shoot(page, url: str, out: Path, after: float) -> None:
    """Open ``url``, let the live run draw for ``after`` seconds, capture the page."""
    page.goto(url)
    page.wait_for_function(f"() => ({CHART}?.dataset.points|0) > 0", timeout=60_000)
    time.sleep(after)
    page.screenshot(path=str(out))
    print(f"wrote {out} ({page.url})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("docs"))
    parser.add_argument("--after", type=float, default=6.0, help="seconds of live run shown")
    args = parser.parse_args()
    out = args.out_dir.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with live_run(root / "summary" / "live"), chromium() as browser:
            with jupyter_lab(root) as (lab, token):
                page = browser.new_page(viewport={"width": 1300, "height": 720})
                page.goto(f"{lab}lab?token={token}")  # Jupyter's login cookie
                page.locator(".jp-LauncherCard", has_text="msmon viewer").wait_for(timeout=90_000)
                shoot(page, f"{lab}msmon/", out / "viewer-jupyterlab.png", args.after)
                page.close()
            with viewer(root / "summary") as (port, secret), code_server(root) as cs:
                page = browser.new_page(viewport={"width": 1300, "height": 720})
                url = f"{cs}proxy/{port}/?msmon_token={secret}"
                shoot(page, url, out / "viewer-code-server.png", args.after)


if __name__ == "__main__":
    main()
