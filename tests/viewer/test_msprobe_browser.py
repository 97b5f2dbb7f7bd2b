"""msprobe monitor output in ``msmon view``: listed as a run with its ranks, served by the
API under our tags, drawn on the page in real headless Chromium.

The files are what mindstudio-probe 26.2.0's ``TrainerMon`` wrote for two ranks of a tiny
MLP (``tests/data/msprobe/generate.py``); the expected values come from its CSVs.
"""

from __future__ import annotations

import shutil

import numpy as np

from tests.events.test_msprobe import DATA, column
from tests.viewer.test_browser import CHART, DRAWN, browser, open_page, wait_for  # noqa: F401

RUN = "monitor_output"
GRAD = "param/fc1.weight/grad_norm"
FIRST = "param/fc1.bias/grad_norm"  # the first tag of the "param grad_norm" chart


def test_api_lists_the_msprobe_dir_as_a_run_with_its_ranks(serve, tmp_path):
    shutil.copytree(DATA, tmp_path / RUN)
    _, client = serve(tmp_path)
    status, runs = client.json("/api/runs")
    assert status == 200
    [run] = runs
    assert (run["name"], run["ranks"], run["last_step"]) == (RUN, [0, 1], 11)
    assert GRAD in run["tags"] and "act/fc1/norm" in run["tags"]
    for rank in (0, 1):
        status, body = client.json(f"/api/scalars?run={RUN}&tag={GRAD}&rank={rank}")
        assert status == 200 and body["steps"] == list(range(12))
        want = column(rank, "grad_reduced", "fc1.weight", "norm")
        np.testing.assert_allclose(body["values"], [want[s] for s in range(12)], rtol=1e-6)


def test_page_draws_an_msprobe_runs_charts_per_rank(browser, serve, tmp_path):  # noqa: F811
    shutil.copytree(DATA, tmp_path / RUN)
    server, _ = serve(tmp_path)
    page, problems = open_page(browser)
    page.goto(server.url)
    box = f"tr[data-run='{RUN}'] input[type=checkbox]"
    page.wait_for_selector(box, timeout=10_000)
    page.wait_for_timeout(500)  # the page may select a lone run itself
    if not page.is_checked(box):
        page.click(box)
    # 4 parameters, 2 ranks: a line each
    wait_for(page, f"(t) => ({DRAWN})(t)?.lines.length === 8", FIRST, timeout=20_000)

    title = page.evaluate(f"(t) => ({CHART})(t).querySelector('.msmon-chart-title').textContent",
                          FIRST)  # fmt: skip
    assert title.startswith("param grad_norm")
    lines = {line["label"]: line for line in page.evaluate(DRAWN, FIRST)["lines"]}
    for rank in (0, 1):
        line = lines[f"{GRAD} rank {rank}"]
        assert line["tag"] == GRAD and line["xs"] == list(range(12))
        want = column(rank, "grad_reduced", "fc1.weight", "norm")
        np.testing.assert_allclose(line["ys"], [want[s] for s in range(12)], rtol=1e-6)
    # activations and what stays msprobe's own are charts too, in the chart plan's order
    tags = page.evaluate(
        "() => [...document.querySelectorAll('#charts .msmon-chart')].map(e => e.dataset.msmonTag)"
    )
    assert "msprobe/actv/act.input/norm" in tags
    order = [tags.index(t) for t in (FIRST, "msprobe/actv/act.input/norm")]
    assert order == sorted(order)
    # its activations: the heatmap (a row per module, the lowest rank's), norm first
    heat = "#charts .msmon-heatmap"
    wait_for(page, f"() => document.querySelector('{heat}')?.msmonChart.drawn().cols.length === 12",
             None)  # fmt: skip
    drawn = page.evaluate(f"() => document.querySelector('{heat}').msmonChart.drawn()")
    assert drawn["stat"] == "norm" and "fc1" in drawn["rows"], drawn["rows"]
    want = column(0, "actv", "fc1.output", "norm")
    np.testing.assert_allclose(drawn["cells"][drawn["rows"].index("fc1")],
                               [want[s] for s in range(12)], rtol=1e-6)  # fmt: skip
    assert problems == []
