"""The viewer through real proxies in headless Chromium, as a remote user reaches it:
JupyterLab's launcher and ``<lab>/msmon/`` (jupyter-server-proxy), and code-server's
``/proxy/PORT/``. The browser uses a non-loopback host name for the proxy
(``tests/support/proxies.py``), so the proxies forward a foreign ``Host``, as JupyterHub's
and a remote code-server's do; before the viewer took the access token these pages were a
403, and before its URLs were relative, a blank page.

Each test checks that the runs list shows the live run and that its chart grows (the live
tail, ``api/stream``, works through the proxy). code-server: ``tests/vscode/
install_code_server.sh build/code-server`` (or ``MSMON_CODE_SERVER``); without it that test
skips, except under CI, which installs it.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.proxies import CODE_SERVER, chromium, code_server, jupyter_lab, live_run
from tests.support.proxies import viewer as msmon_view

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("chromium") and not os.environ.get("CI"), reason="no chromium"
    ),
]
LOSS = "train/loss"
CHART = "(t) => document.querySelector(`#charts .msmon-chart[data-msmon-tag='${t}']`)"


def page_of(browser) -> tuple:
    page = browser.new_page(viewport={"width": 1300, "height": 800})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    # which URL answered an error: the console line above does not say
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
    return page, problems


def assert_live(page, run: str) -> None:
    """The run is listed, its chart is drawn and grows, the live stream is connected."""
    page.wait_for_selector(f"#runs tr[data-run='{run}']", timeout=30_000)
    page.wait_for_function("() => document.querySelector('#live').textContent === 'live'")
    page.wait_for_function(f"(t) => (({CHART})(t)?.dataset.points|0) > 0", arg=LOSS, timeout=30_000)
    for _ in range(3):
        last = int(page.evaluate(f"(t) => ({CHART})(t).dataset.lastStep", LOSS))
        page.wait_for_function(
            f"([t, s]) => (({CHART})(t).dataset.lastStep|0) > s", arg=[LOSS, last], timeout=5_000
        )


def test_jupyterlab_launcher_and_lab_msmon_open_the_live_viewer(tmp_path):
    run = live_run(tmp_path / "summary" / "live")
    with run, jupyter_lab(tmp_path) as (lab, token), chromium() as browser:
        page, problems = page_of(browser)
        page.goto(f"{lab}lab?token={token}")  # Jupyter's login: its cookie from here on
        card = page.locator(".jp-LauncherCard", has_text="msmon viewer")
        card.wait_for(timeout=90_000)
        assert card.locator("svg, img").count() >= 1  # the package's icon
        with page.context.expect_page(timeout=60_000) as opened:
            card.click()
        viewer = opened.value
        viewer_problems: list[str] = []
        viewer.on("pageerror", lambda exc: viewer_problems.append(str(exc)))
        viewer.wait_for_load_state()
        assert viewer.url == f"{lab}msmon/"
        assert_live(viewer, "summary/live")
        # <lab>/msmon/ typed in: the same viewer, Jupyter's login is all it takes
        page.goto(f"{lab}msmon/")
        assert_live(page, "summary/live")
        assert problems == [] and viewer_problems == []


@pytest.mark.skipif(not CODE_SERVER and not os.environ.get("CI"), reason="no code-server")
def test_code_server_proxy_path_opens_the_live_viewer_with_the_token_once(tmp_path):
    base = tmp_path / "summary"
    view = msmon_view(base)
    with (
        live_run(base / "live"),
        view as (port, token),
        code_server(tmp_path) as cs,
        chromium() as browser,
    ):
        page, problems = page_of(browser)
        # a foreign Host without the token: refused, and the answer says how to fix it
        resp = page.goto(f"{cs}proxy/{port}/")
        assert resp.status == 403 and "?msmon_token=" in page.content()
        problems.clear()  # the console's "403" line for that page
        # the printed token once: cookie set, redirected to the proxied root
        page.goto(f"{cs}proxy/{port}/?msmon_token={token}")
        assert page.url == f"{cs}proxy/{port}/"
        assert_live(page, "live")
        # later visits need only the cookie
        page.goto(f"{cs}proxy/{port}/")
        assert_live(page, "live")
        assert problems == []
