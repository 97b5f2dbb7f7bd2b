"""Two optimizers in the notebook panel, in a real JupyterLab 4 (headless Chromium).

1. A tiny GAN trained in the kernel (``tests.support.tinygan``, its source run as a
   cell) records each optimizer's own series, and the panel of its run shows what the
   viewer shows: one grad_norm chart with a line per optimizer in its legend, labelled
   ``netd`` and ``netg``, the title saying why there is no whole-step line, D's
   explosion on that chart and named in the panel's alert list.
2. Live: the shipped ``notebooks/gan.ipynb`` networks under ``%%msmonitor`` (the watch
   collects each optimizer's series): both lines advance while the cell runs.

Everything asserted is read from the page.
"""

from __future__ import annotations

import inspect
import json
import time

import pytest

from tests.conftest import ROOT
from tests.support import tinygan
from tests.support.jupyter_app import (
    KERNEL_STATUS_JS,
    cell_done_js,
    jupyter_page,
    run_all,
    write_notebook,
)

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


LIVE_TRAIN = """%%msmonitor --dir {base} --run live_gan
import time
for i in range(300):
    real = ms.Tensor(real_batch())
    z = ms.Tensor(rng.normal(size=(B, Z)).astype(np.float32))
    loss_d = trainD(real, z)
    loss_g = trainG(real, z)
    time.sleep(0.03)
"""
LIVE_JS = f"""() => {{
  const charts = {{}};
  for (const el of document.querySelectorAll('[data-msmon-tag]')) {{
    charts[el.dataset.msmonTag] = Number(el.dataset.lastStep);
  }}
  const status = document.querySelector('.msmon-status');
  return {{charts, status: status ? status.textContent : '', kernel: {KERNEL_STATUS_JS}}};
}}"""


@pytest.mark.slow
def test_the_live_panel_of_the_shipped_gan_notebook_draws_a_line_per_network(tmp_path):
    """notebooks/gan.ipynb's networks and train cells under ``%%msmonitor`` (the watch
    names the optimizers netd and netg from the loop's variables): while the cell runs,
    the grad_norm chart holds both networks' lines, each advancing, and no empty
    whole-step chart waits beside them."""
    shipped = json.loads((ROOT / "notebooks" / "gan.ipynb").read_text())
    setup = "".join(shipped["cells"][2]["source"])
    assert "trainD = nn.TrainOneStepCell" in setup
    cells = ["%load_ext msmon_nb", setup, LIVE_TRAIN.format(base=tmp_path / "summary")]
    write_notebook(tmp_path / "live_gan.ipynb", cells)
    with jupyter_page(tmp_path, "live_gan.ipynb") as page:
        run_all(page)
        page.wait_for_function(
            f"document.querySelector('{GRAD}')?.dataset.lastStep > 5", timeout=180_000
        )
        samples = []
        for _ in range(6):
            time.sleep(1.0)
            samples.append(page.evaluate(LIVE_JS))
        assert [s["kernel"] for s in samples] == ["busy"] * len(samples)
        for tag in (tinygan.GRAD_D, tinygan.GRAD_G, "opt/netd/loss", "opt/netg/loss"):
            lasts = [s["charts"][tag] for s in samples]
            assert lasts[-1] > lasts[0] >= 0, (tag, lasts)
        whole = {"train/loss", "train/grad_norm", "train/learning_rate"}
        assert not [s for s in samples if whole & set(s["charts"])]
        drawn = page.evaluate(DRAWN)
        assert sorted(line["label"] for line in drawn["lines"]) == ["netd", "netg"]
        title = page.locator(GRAD).locator(".msmon-chart-title").inner_text()
        assert title.startswith("grad_norm · 2 optimizers: one line each")
        # the rest of the 300 iterations shows nothing new: the panel's Stop ends the cell
        page.locator(".msmon-panel button", has_text="Stop").first.click()
        page.wait_for_function(cell_done_js(2), timeout=60_000)
