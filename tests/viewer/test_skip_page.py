"""A skipped update shows in the pages: the alert and the skipped-steps chart.

Real CPU training with ``action: skip`` (tests/collect/test_skip.py has the bit-exact
checks), then the viewer served over HTTP and opened in headless Chromium (as
tests/viewer/test_browser.py does), and a ``%%msmonitor`` cell run in a real JupyterLab
(tests/notebook/jupyter_app.py). Without playwright (CI's 2.7.1 version job) they skip.
"""

from __future__ import annotations

import pytest

from msmon_nb.monitor import Monitor
from tests.collect.test_skip import BAD, batches, pynative_loop, skip_config
from tests.support.kernel_code import MLP_SETUP
from tests.viewer.conftest import serve  # noqa: F401 (fixture)
from tests.viewer.test_browser import browser, open_page, wait_for  # noqa: F401 (fixture)

TAG = "train/skipped_steps"


def test_skip_alert_and_count_in_the_viewer_page(browser, serve, tmp_path):  # noqa: F811
    step, _opt = pynative_loop()
    with Monitor(skip_config(tmp_path), run_name="skiprun") as mon, mon.watch():
        for a, b in batches():
            step(a, b)
    server, client = serve(tmp_path)
    status, alerts = client.json("/api/alerts?run=skiprun")
    assert status == 200
    skips = [a for a in alerts if a.get("action") == "skip"]
    assert [(a["step"], a["kind"]) for a in skips] == [(BAD, "grad_explosion")]

    page, problems = open_page(browser)
    page.goto(server.url)
    box = page.locator("tr[data-run='skiprun'] input[type=checkbox]")
    box.wait_for()
    if not box.is_checked():
        box.click()
    row = "#alerts tbody tr[data-kind='grad_explosion']"
    wait_for(page, f'() => document.querySelector("{row}") !== null')
    text = page.locator(row).first.inner_text()
    assert f"at step {BAD}: update skipped (1 in a row)" in text
    wait_for(page, "(t) => (document.getElementById('chart-' + t)?.dataset.points|0) > 0", TAG)
    assert problems == []


PANEL_SETUP = MLP_SETUP.replace("OPTIMIZER", "opt = nn.Adam(net.trainable_params(), 0.01)")

PANEL_TRAIN = """%%msmonitor --dir {base} --run skip --config {config}
import time
for step in range(200):
    # step 40: large inputs with flipped labels, a batch no converged model agrees with
    loss, grads = grad_fn(x * 30, 1 - y) if step == 40 else grad_fn(x, y)
    opt(grads)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_skip_alert_and_count_in_the_live_panel(tmp_path):
    """The %%msmonitor panel in a real JupyterLab lists the skip alert and charts the
    skipped-steps count while the cell runs."""
    pytest.importorskip("playwright.sync_api")
    from tests.support.jupyter_app import jupyter_page, run_all, write_notebook

    config = tmp_path / "skip.yaml"
    config.write_text("alerts: {grad_explosion: {action: skip, skip_above: 5.0}}\n")
    train = PANEL_TRAIN.format(base=str(tmp_path / "runs"), config=str(config))
    write_notebook(tmp_path / "skip.ipynb", [PANEL_SETUP, train])
    with jupyter_page(tmp_path, "skip.ipynb") as page:
        run_all(page)
        page.wait_for_function(
            "(document.querySelector('.msmon-alerts')?.innerText || '').includes('update skipped')",
            timeout=120_000,
        )
        alerts = page.locator(".msmon-alerts").inner_text()
        assert "at step 40: update skipped (1 in a row)" in alerts
        page.wait_for_function(
            f"Number(document.querySelector('[data-msmon-tag=\"{TAG}\"]')?.dataset.lastStep) >= 40",
            timeout=60_000,
        )
