"""The activations heatmap on the viewer's page, in real headless Chromium, while a real
tiny MindSpore training (``tests.support.acttrain``) writes its run.

What the user sees is read from the page: one heatmap instead of a line chart per
module and statistic; a row per module in forward order; a column per collected step,
more of them as steps arrive; the NaN the data put into ``aux``'s output at ``NAN_STEP``
drawn red in ``aux``'s row at that step's column (the canvas pixel, not only the data)
and nowhere else; its hover text; the statistic selector.
"""

from __future__ import annotations

import os
import subprocess
import sys

from msmon_nb.events.runs import load_run
from msmon_nb.metrics.charts import CHART_ASSETS
from tests.conftest import ROOT
from tests.support.acttrain import CRITICAL, EVERY, NAN_STEP, RED, ROWS, SCRIPT, heat_pixel_js
from tests.viewer.test_browser import browser, open_page, wait_for  # noqa: F401

STEPS = 60
HEAT = "#charts .msmon-heatmap"
DRAWN = f"() => document.querySelector('{HEAT}').msmonChart.drawn()"
PIXEL = heat_pixel_js(HEAT)
RING_TOP = heat_pixel_js(HEAT, ring_top=True)


def attr(page, name: str) -> str | None:
    return page.get_attribute(HEAT, name)


def test_activations_heatmap_grows_live_and_marks_the_nan_in_its_module(
    browser,  # noqa: F811
    serve,
    tmp_path,
):
    train = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(STEPS), "0.12"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT)),
    )
    try:
        assert train.stdout.readline().strip() == "started"
        server, _ = serve(tmp_path)
        page, problems = open_page(browser)
        page.goto(server.url)
        # the running run is selected by the page itself; its heatmap comes and grows
        wait_for(
            page, f"() => (document.querySelector('{HEAT}')?.dataset.cols|0) > 0", None, 30_000
        )
        first = int(attr(page, "data-cols"))
        wait_for(
            page, f"(n) => (document.querySelector('{HEAT}').dataset.cols|0) > n + 2", first, 20_000
        )
        assert train.poll() is None, "the run ended before the heatmap was seen to grow"
        assert train.wait(timeout=120) == 0
    finally:
        if train.poll() is None:
            train.kill()
    collected = list(range(0, STEPS, EVERY))
    wait_for(
        page, f"(n) => (document.querySelector('{HEAT}').dataset.cols|0) === n", len(collected)
    )

    # one heatmap, no per-module line charts for act/ tags
    assert page.locator(HEAT).count() == 1
    lines = page.evaluate(
        "() => [...document.querySelectorAll('#charts .msmon-chart:not(.msmon-heatmap)')]"
        ".map((e) => e.dataset.msmonTag).filter((t) => t.startsWith('act/'))"
    )
    assert lines == []
    drawn = page.evaluate(DRAWN)
    assert drawn["stat"] == "norm" and attr(page, "data-stat") == "norm"
    assert drawn["rows"] == ROWS  # forward order: not alphabetical, not definition order
    assert [c["lo"] for c in drawn["cols"]] == collected
    assert drawn["scale"] == "log"
    # the cells are the recorded norms; the NaN is marked in aux's row at its step only
    run = load_run(tmp_path / "acts")
    col = collected.index(NAN_STEP)
    for i, row in enumerate(ROWS):
        values = run.scalars(f"act/{row}/norm").values.tolist()
        for j, cell in enumerate(drawn["cells"][i]):
            if row == "aux" and j == col:
                assert cell == "nan"
            else:
                assert abs(cell - values[j]) <= 1e-6 * abs(values[j]), (row, j)
    assert attr(page, "data-bad") == "1"
    aux = ROWS.index("aux")
    assert page.evaluate(PIXEL, [aux, col]) == RED
    for i, j in [(aux, col - 1), (aux, col + 1), (0, col), (1, col)]:
        assert page.evaluate(PIXEL, [i, j]) != RED, (i, j)
    # a colour bar with values: its top is the largest norm drawn
    finite = [c for row in drawn["cells"] for c in row if isinstance(c, float)]
    assert drawn["bar"][0] == page.evaluate("(v) => fmtNum(v)", max(finite))

    # the activation rules name aux as the NaN's origin (nonfinite_origin, at its step):
    # a ring in the critical colour round aux's cell there, drawn on the canvas
    wait_for(page, f"() => ({DRAWN})().alerts.some((a) => a.module === 'aux')", None, 20_000)
    marks = page.evaluate(DRAWN)["alerts"]
    assert {"row": aux, "col": col, "step": NAN_STEP, "severity": "critical", "module": "aux"} in (
        marks
    ), marks
    assert page.evaluate(RING_TOP, [aux, col]) == CRITICAL

    # the hover names module, step and value
    page.locator(f"{HEAT} canvas").scroll_into_view_if_needed()
    box = page.locator(f"{HEAT} canvas").bounding_box()
    g = drawn["geometry"]
    page.mouse.move(
        box["x"] + g["left"] + (col + 0.5) * g["cellW"],
        box["y"] + g["top"] + (aux + 0.5) * g["cellH"],
    )
    tip = page.locator(f"{HEAT} .msmon-heat-tip")
    tip.wait_for(state="visible", timeout=5_000)
    assert tip.inner_text() == f"aux · step {NAN_STEP} · norm nan"

    # another statistic: zero_frac of the modules; aux's step stays marked by its
    # nonfinite count although its zero share is a finite number
    page.select_option(f"{HEAT} select.msmon-heat-stat", "zero_frac")
    wait_for(page, f"() => {DRAWN.replace('() => ', '')}.stat === 'zero_frac'")
    wait_for(page, f"() => document.querySelector('{HEAT}').dataset.stat === 'zero_frac'")
    wait_for(page, f"(n) => ({DRAWN})().cols.length === n", len(collected))
    zero = page.evaluate(DRAWN)
    assert zero["scale"] == "linear"  # zero shares of 0: no log colours
    want = run.scalars("act/embed/zero_frac").values.tolist()
    assert zero["cells"][0] == [float(v) for v in want]
    assert zero["cells"][aux][col] == "nonfinite"
    assert page.evaluate(PIXEL, [aux, col]) == RED

    # the snapshot taken after the NaN step lists each module's statistics at that step,
    # aux's row marked
    rows = page.locator("#act-snapshots tr[data-act-snapshot]")
    assert page.is_visible("#act-snapshots-section")
    names = [rows.nth(i).get_attribute("data-act-snapshot") for i in range(rows.count())]
    assert names == [f"act/{r}" for r in ROWS]
    assert {rows.nth(i).get_attribute("data-step") for i in range(3)} == {str(NAN_STEP)}
    assert [rows.nth(i).get_attribute("data-bad") for i in range(3)] == [None, None, "1"]
    aux_cells = rows.nth(aux).locator("td").all_inner_texts()
    assert aux_cells[1:3] == ["aux", "manual"] and aux_cells[3] == "nan"
    assert aux_cells[6] == "3"  # nonfinite: the NaN, through a 4 -> 3 Dense
    assert problems == []


LONG = """() => {
  const rows = ["a", "b"];
  const heat = new MsmonHeatmap({title: "act", tags: ["act/a/norm", "act/b/norm"],
    group: "act", rows, stats: ["norm"], log: true});
  document.body.append(heat.el);
  const xs = [...Array(5000).keys()];
  const a = xs.map(() => 1);
  a[1234] = 1e6;  // a one-step blow-up
  const b = xs.map(() => 2);
  b[4321] = null;  // NaN: a gap in the values, a mark of its own
  heat.set([{row: "a", xs, ys: a, nonfinite: [], flagged: []},
            {row: "b", xs, ys: b, nonfinite: [[4321, "nan"]], flagged: []}], {width: 900});
  const d = heat.drawn();
  const at = (s) => d.cols.findIndex((c) => c.lo <= s && s <= c.hi);
  return {cols: d.cols.length, first: d.cols[0], last: d.cols[d.cols.length - 1],
          spike: d.cells[0][at(1234)], before: d.cells[0][at(1234) - 1],
          nan: d.cells[1][at(4321)], next: d.cells[1][at(4321) + 1],
          covered: d.cols.every((c, i) => i === 0 || c.lo === d.cols[i - 1].hi + 1),
          text: heat.cellText(0, at(1234)), bar: d.bar};
}"""


def test_a_long_run_is_thinned_to_columns_that_keep_a_one_step_spike_and_a_nan(
    browser,  # noqa: F811
):
    """5,000 collected steps in a 900 px chart: fewer columns than steps, each a range of
    steps (together every step, none twice) showing its value of largest magnitude: a
    one-step blow-up and a NaN survive the thinning."""
    page, problems = open_page(browser)
    page.set_content("<html><body></body></html>")
    for name in ("chart.js", "heatmap.js"):
        page.add_script_tag(path=str(CHART_ASSETS / name))
    got = page.evaluate(LONG)
    assert 100 <= got["cols"] <= 450, got["cols"]
    assert got["first"]["lo"] == 0 and got["last"]["hi"] >= 4999 and got["covered"]
    assert got["spike"] == 1e6 and got["before"] == 1
    assert got["nan"] == "nan" and got["next"] == 2
    assert got["text"].startswith("a · steps ") and got["text"].endswith("· norm 1.000e+6")
    assert got["bar"] == ["1.000e+6", "1000", "1"]  # log scale: 1 .. 1e6, its middle 1e3
    assert problems == []
