"""Two optimizers on the viewer's page, in real headless Chromium: a tiny GAN
(``tests.support.tinygan``: the MindSpore tutorial's functional shape) records each
optimizer's own series; the page draws one grad_norm chart with a line per optimizer,
labelled by its name, says in the title why there is no whole-step line, and draws D's
gradient explosion on that chart and no other.

The series are recorded with ``mon.step``'s extra scalars (the collectors write the same
tags); the values are float64 norms of the gradients each Adam received.
"""

from __future__ import annotations

import numpy as np

from tests.support.tinygan import GRAD_D, GRAD_G, train_gan
from tests.viewer.test_browser import CHART, DRAWN, browser, open_page, wait_for  # noqa: F401

STEPS = 50
BURST = 35  # from here on D's gradients reach its Adam scaled by 1e4 (a scale not undone)


def test_one_grad_norm_chart_a_line_per_optimizer_and_ds_alert_on_it(
    browser,  # noqa: F811
    serve,
    tmp_path,
):
    from msmon_nb.monitor import Monitor

    with Monitor(save_dir=str(tmp_path), run_name="gan") as mon:
        seen = train_gan(mon, STEPS, BURST)
    [boom] = [a for a in mon.alerts if a.kind == "grad_explosion"]
    assert (boom.tag, boom.since_step) == (GRAD_D, BURST)

    server, _ = serve(tmp_path)
    page, problems = open_page(browser)
    page.goto(server.url)
    box = "tr[data-run='gan'] input[type=checkbox]"
    page.wait_for_selector(box, timeout=10_000)
    page.wait_for_timeout(500)  # the page may select a lone run itself
    if not page.is_checked(box):
        page.click(box)
    wait_for(page, f"(t) => ({DRAWN})(t)?.lines.length === 2", GRAD_D, timeout=20_000)
    wait_for(page, f"(t) => ({DRAWN})(t).alerts.length > 0", GRAD_D)

    # one grad_norm chart: D's tag on the element, G's on its tag mark, both drawn to the end
    tags = page.evaluate(
        "() => [...document.querySelectorAll('#charts .msmon-chart')].map(e => e.dataset.msmonTag)"
    )
    assert tags[:3] == ["opt/netd/loss", GRAD_D, "opt/netd/learning_rate"]
    assert not {"train/loss", "train/grad_norm", "train/learning_rate"} & set(tags)
    chart = page.locator(f"#charts .msmon-chart[data-msmon-tag='{GRAD_D}']")
    assert chart.get_attribute("data-last-step") == str(STEPS - 1)
    mark = chart.locator(f".msmon-tagmark[data-msmon-tag='{GRAD_G}']")
    assert mark.get_attribute("data-last-step") == str(STEPS - 1)
    assert chart.get_attribute("data-scale") == "log"

    # the legend names the optimizers; each line is what that optimizer received
    drawn = page.evaluate(DRAWN, GRAD_D)
    lines = {line["label"]: line for line in drawn["lines"]}
    assert sorted(lines) == ["netd", "netg"]
    assert (lines["netd"]["tag"], lines["netg"]["tag"]) == (GRAD_D, GRAD_G)
    for label, tag in (("netd", GRAD_D), ("netg", GRAD_G)):
        assert lines[label]["xs"] == list(range(STEPS))
        np.testing.assert_allclose(lines[label]["ys"], seen[tag], rtol=1e-6)  # float32 on disk
    legend = page.evaluate(
        f"(t) => [...({CHART})(t).querySelectorAll('.u-legend .u-series th')]"
        ".map((e) => e.textContent.trim()).filter(Boolean)",
        GRAD_D,
    )
    assert "netd" in legend and "netg" in legend

    # the title says one line each; its hover text why there is no whole-step line
    title = chart.locator(".msmon-chart-title")
    assert title.text_content().startswith("grad_norm · 2 optimizers: one line each")
    note = title.get_attribute("title")
    assert "netd and netg step in each iteration" in note
    assert "a whole-step train/grad_norm would mix their networks" in note

    # each alert is drawn on the chart of its series only: D's explosion on grad_norm,
    # whatever the run found in a loss (G's rising loss, here) on the loss chart
    assert [a["step"] for a in drawn["alerts"]] == [BURST]
    for first, members in (("opt/netd/loss", ("opt/netd/loss", "opt/netg/loss")),
                           ("opt/netd/learning_rate", ())):  # fmt: skip
        want = sorted(a.since_step for a in mon.alerts if a.tag in members)
        assert sorted(a["step"] for a in page.evaluate(DRAWN, first)["alerts"]) == want
    row = page.locator("#alerts tr", has_text="grad_explosion")
    assert row.count() == 1
    assert f"netd grad_norm exploding since step {BURST}" in row.text_content()
    assert problems == []
