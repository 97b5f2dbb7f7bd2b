"""Two optimizers in the notebook panel, in a real JupyterLab 4 (headless Chromium): a tiny
GAN trained in the kernel (``tests.support.tinygan``, its source run as a cell) records
each optimizer's own series, and the panel of its run shows what the viewer shows: one
grad_norm chart with a line per optimizer in its legend, labelled ``netd`` and ``netg``,
the title saying why there is no whole-step line, D's explosion on that chart and named
in the panel's alert list. Everything asserted is read from the page.
"""

from __future__ import annotations

import inspect

import pytest

from tests.support import tinygan
from tests.support.jupyter_app import cell_done_js, jupyter_page, run_all, write_notebook

STEPS = 50
BURST = 35
SHOW = """%load_ext msmon_nb
import msmon_nb as mm
with mm.Monitor(save_dir={base!r}, run_name="gan") as mon:
    seen = train_gan(mon, {steps}, {burst})
mm.show(mon.run_dir)"""
GRAD = f'[data-msmon-tag="{tinygan.GRAD_D}"]'
DRAWN = f"() => document.querySelector('{GRAD}').msmonChart.drawn()"


@pytest.mark.slow
def test_the_panel_draws_a_line_per_optimizer_named_by_it(tmp_path):
    show = SHOW.format(base=str(tmp_path / "summary"), steps=STEPS, burst=BURST)
    write_notebook(tmp_path / "gan.ipynb", [inspect.getsource(tinygan), show])
    with jupyter_page(tmp_path, "gan.ipynb") as page:
        run_all(page)
        page.wait_for_function(cell_done_js(1), timeout=180_000)
        page.wait_for_function(
            f"document.querySelector('{GRAD}')?.dataset.lastStep === '{STEPS - 1}'",
            timeout=60_000,
        )
        tags = page.evaluate(
            "() => [...document.querySelectorAll('.msmon-chart')].map(e => e.dataset.msmonTag)"
        )
        assert tags[:3] == ["opt/netd/loss", tinygan.GRAD_D, "opt/netd/learning_rate"]
        assert not {"train/loss", "train/grad_norm", "train/learning_rate"} & set(tags)
        chart = page.locator(GRAD)
        mark = chart.locator(f'.msmon-tagmark[data-msmon-tag="{tinygan.GRAD_G}"]')
        assert mark.get_attribute("data-last-step") == str(STEPS - 1)
        drawn = page.evaluate(DRAWN)
        assert sorted(line["label"] for line in drawn["lines"]) == ["netd", "netg"]
        legend = chart.locator(".u-legend").inner_text()
        assert "netd" in legend and "netg" in legend and "opt/" not in legend
        title = chart.locator(".msmon-chart-title")
        assert title.inner_text().startswith("grad_norm · 2 optimizers: one line each")
        assert "a whole-step train/grad_norm would mix" in title.get_attribute("title")
        assert [a["step"] for a in drawn["alerts"]] == [BURST]
        alerts = page.locator(".msmon-alerts").inner_text()
        assert f"netd grad_norm exploding since step {BURST}" in alerts
        assert chart.get_attribute("data-scale") == "log"
