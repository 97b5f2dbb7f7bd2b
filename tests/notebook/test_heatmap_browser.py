"""The activations heatmap in the live panel, in a real JupyterLab 4 (headless Chromium),
while a ``%%msmonitor`` cell trains a real tiny MindSpore model (``tests.support.acttrain``:
activations tracked every ``EVERY`` steps, a NaN in ``aux``'s input at ``NAN_STEP``).

Read from the page: the heatmap appears and gains columns while the kernel is busy; it
has one row per module in forward order and a column per collected step; the NaN is red
on the canvas in ``aux``'s row at that step and nowhere else; no line chart per module is
drawn; the Snapshot button lists each module's activation statistics in the panel.
"""

from __future__ import annotations

import pytest

from msmon_nb.events.runs import load_run
from tests.support.acttrain import CRITICAL, EVERY, NAN_STEP, NET, RED, ROWS, heat_pixel_js
from tests.support.jupyter_app import (
    KERNEL_STATUS_JS,
    cell_done_js,
    jupyter_page,
    run_all,
    write_notebook,
)

STEPS = 90
SETUP = 'import os\nos.environ["GLOG_v"] = "3"\n' + NET + "\n%load_ext msmon_nb"
CONFIG = f"""monitor_config:
  log_interval: {EVERY}
  track_metrics: [loss, grad_norm, learning_rate, activations]
"""
TRAIN = f"%%msmonitor --dir summary --run acts --config m.yaml\ntrain({STEPS}, 0.12)"
HEAT = ".msmon-panel .msmon-heatmap"
DRAWN = f"document.querySelector('{HEAT}').msmonChart.drawn()"
PIXEL = heat_pixel_js(HEAT)
RING_TOP = heat_pixel_js(HEAT, ring_top=True)
COLS = f"(document.querySelector('{HEAT}')?.dataset.cols|0)"


@pytest.mark.slow
def test_the_panel_draws_the_activations_heatmap_live_with_the_nan_in_its_module(tmp_path):
    (tmp_path / "m.yaml").write_text(CONFIG)
    write_notebook(tmp_path / "acts.ipynb", [SETUP, TRAIN])
    with jupyter_page(tmp_path, "acts.ipynb") as page:
        run_all(page)
        page.wait_for_function(f"{COLS} > 0", timeout=120_000)
        first = page.evaluate(COLS)
        # it grows while the cell runs (the kernel busy all along)
        page.wait_for_function(f"{COLS} > {first + 3}", timeout=30_000)
        assert page.evaluate(KERNEL_STATUS_JS) == "busy"
        # Snapshot: each module's activation statistics, listed by the panel
        page.locator(".msmon-panel button", has_text="Snapshot").first.click()
        page.wait_for_function(
            "document.querySelector('.msmon-result').textContent.startsWith('snapshot of')",
            timeout=20_000,
        )
        answer = page.locator(".msmon-result").inner_text()
        assert f"and {len(ROWS)} modules' activations at step" in answer, answer
        rows = page.locator(".msmon-act-snapshots tr[data-act-snapshot]")
        rows.first.wait_for(timeout=10_000)
        names = [rows.nth(i).get_attribute("data-act-snapshot") for i in range(rows.count())]
        assert names == [f"act/{r}" for r in ROWS]
        cells = rows.first.locator("td").all_inner_texts()
        assert len(cells) == 3 + 5 and cells[1] == "embed"  # step, module, reason, 5 stats
        page.wait_for_function(cell_done_js(1), timeout=120_000)
        collected = list(range(0, STEPS, EVERY))
        page.wait_for_function(f"{COLS} === {len(collected)}", timeout=20_000)
        page.locator(HEAT).scroll_into_view_if_needed()
        drawn = page.evaluate(DRAWN)
        lines = page.evaluate(
            "[...document.querySelectorAll('.msmon-panel .msmon-chart:not(.msmon-heatmap)')]"
            ".map((e) => e.dataset.msmonTag).filter((t) => t.startsWith('act/'))"
        )
        page.screenshot(path=str(tmp_path / "heatmap-panel.png"), full_page=True)
        pixels = {
            (i, j): page.evaluate(PIXEL, [i, j])
            for i in range(len(ROWS))
            for j in range(len(collected))
        }
        aux, col = ROWS.index("aux"), collected.index(NAN_STEP)
        ring = page.evaluate(RING_TOP, [aux, col])

    assert lines == []
    assert drawn["stat"] == "norm" and drawn["rows"] == ROWS
    assert [c["lo"] for c in drawn["cols"]] == collected
    run = load_run(tmp_path / "summary" / "acts")
    # the activation rules name aux as the NaN's origin: a ring round its cell there
    mark = {"row": aux, "col": col, "step": NAN_STEP, "severity": "critical", "module": "aux"}
    assert mark in drawn["alerts"], drawn["alerts"]
    assert ring == CRITICAL
    for i, row in enumerate(ROWS):
        want = run.scalars(f"act/{row}/norm").values.tolist()
        for j, cell in enumerate(drawn["cells"][i]):
            if (i, j) == (aux, col):
                assert cell == "nan"
                assert pixels[i, j] == RED
            else:
                assert abs(cell - want[j]) <= 1e-6 * abs(want[j]), (row, j)
                assert pixels[i, j] != RED, (row, j)
