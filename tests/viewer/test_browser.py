"""The page in real headless Chromium: live tail, two runs, box-zoom to raw points, NaN marker,
the panel's chart order, ranks as lines or a band.

The charts are the notebook panel's component (``msmon_nb/static/chart.js``): each chart
element carries ``data-msmon-tag`` / ``data-last-step`` like the panel's, and
``element.msmonChart.drawn()`` says what it draws.

Debian's ``chromium`` driven by Playwright (``executable_path``; ``playwright install``
cannot download browsers here). Screenshots go to ``docs/`` and the README and the guide show them.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import ALERTS, SNAPSHOTS
from tests.conftest import ROOT
from tests.support.livewriter import WRITER

# screenshots for the README and the guide: written to docs/ only when asked
# (MSMON_UPDATE_DOCS=1), so a test run leaves the work tree clean
DOCS = ROOT / "docs" if os.environ.get("MSMON_UPDATE_DOCS") == "1" else None
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--metrics-recording-only",
    "--no-first-run",
]
NAN_STEP = 500
SPIKE_STEP = 31_337
LOSS = "train/loss"

# JavaScript helpers run in the page: what the chart of a tag draws (chart.js's drawn())
CHART = "(t) => document.querySelector(`#charts .msmon-chart[data-msmon-tag='${t}']`)"
DRAWN = f"(t) => ({CHART})(t)?.msmonChart.drawn()"
LINES = f"""([t, role]) => {{
  const d = ({DRAWN})(t);
  return d ? d.lines.filter((l) => l.role === role) : [];
}}"""
DRAG_BOX = f"""([t, x0, x1]) => {{
  const u = ({CHART})(t).msmonChart.plot;
  const box = u.over.getBoundingClientRect();
  return {{
    x0: box.left + u.valToPos(x0, 'x'), x1: box.left + u.valToPos(x1, 'x'),
    y0: box.top + 5, y1: box.bottom - 5,
  }};
}}"""
ORDER = (
    "() => [...document.querySelectorAll('#charts .msmon-chart')].map((e) => e.dataset.msmonTag)"
)


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return path


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    exe = chromium_path()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def base(tmp_path):
    """A finished 50k-step run with a NaN, a spike, an alert and a snapshot."""
    n = 50_000
    steps = np.arange(n)
    loss = (2.0 * np.exp(-steps / 8000) + 0.05 * np.sin(steps / 50)).astype(np.float32)
    loss[NAN_STEP] = np.nan
    loss[SPIKE_STEP] = 40.0
    lr = np.minimum(steps / 2000, 1.0) * 1e-3
    rng = np.random.default_rng(0)
    with EventWriter(tmp_path / "baseline") as writer:
        for step in range(n):
            values = {LOSS: float(loss[step]), "train/learning_rate": float(lr[step])}
            if step == n // 2:  # a tag only the middle of the file holds
                values["val/acc"] = 0.75
            writer.add_scalars(step, values)
            if step == NAN_STEP:
                writer.add_histogram("snap/fc1.weight/hist", rng.normal(size=2000), step=step)
    alert = {
        "step": NAN_STEP, "since_step": NAN_STEP, "kind": "nonfinite", "severity": "critical",
        "message": "train/loss is NaN at step 500", "tag": LOSS, "value": float("nan"),
    }  # fmt: skip
    (tmp_path / "baseline" / ALERTS).write_text(json.dumps(alert) + "\n")
    snap = {
        "step": NAN_STEP, "name": "fc1.weight", "reason": "alert", "shape": [40, 50],
        "dtype": "float32", "stats": {"min": -3.1, "max": 3.4, "mean": 0.01, "std": 1.0,
                                      "nan_count": 0, "inf_count": 0},
    }  # fmt: skip
    (tmp_path / "baseline" / SNAPSHOTS).write_text(json.dumps(snap) + "\n")
    return tmp_path


def drag(page, tag: str, x0: float, x1: float) -> None:
    """Box-zoom like a user: press, drag across the plot area, release."""
    box = page.evaluate(DRAG_BOX, [tag, x0, x1])
    page.mouse.move(box["x0"], box["y0"])
    page.mouse.down()
    page.mouse.move((box["x0"] + box["x1"]) / 2, (box["y0"] + box["y1"]) / 2, steps=5)
    page.mouse.move(box["x1"], box["y1"], steps=5)
    page.mouse.up()


def open_page(browser) -> tuple:
    """A page, and the list its JavaScript errors and console errors are collected in."""
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    return page, problems


def wait_for(page, expr: str, arg=None, timeout: float = 10_000):
    page.wait_for_function(expr, arg=arg, timeout=timeout)


def lines(page, tag: str, role: str = "line") -> dict[str, dict]:
    return {line["label"]: line for line in page.evaluate(LINES, [tag, role])}


def attr(page, tag: str, name: str) -> str | None:
    return page.evaluate(f"([t, n]) => ({CHART})(t)?.getAttribute(n)", [tag, name])


def test_live_run_two_runs_zoom_raw_and_nan_marker(browser, base, serve, tmp_path):
    from msmon_nb.metrics.decimate import ema

    shots = DOCS or tmp_path
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(base / "live"), "0.3"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        writer.stdout.readline()
        server, _ = serve(base)
        page, problems = open_page(browser)
        page.goto(server.url)

        # 1. the running run is selected at start and its chart advances live: its
        # data-last-step moves on within every 2 s
        wait_for(page, "() => document.querySelector('#live').textContent === 'live'")
        wait_for(page, f"(t) => (({CHART})(t)?.dataset.points|0) > 0", LOSS)
        assert list(lines(page, LOSS)) == ["live"]
        first_len = len(lines(page, LOSS)["live"]["xs"])
        for _ in range(3):
            last = int(attr(page, LOSS, "data-last-step"))
            advanced = f"([t, s]) => (({CHART})(t).dataset.lastStep|0) > s"
            wait_for(page, advanced, [LOSS, last], 2_000)
        assert len(lines(page, LOSS)["live"]["xs"]) > first_len

        # 2. select a second run: both are compared on the same chart
        page.click("tr[data-run='baseline'] input[type=checkbox]")
        wait_for(page, f"(t) => ({DRAWN})(t).lines.length === 2", LOSS)
        assert sorted(lines(page, LOSS)) == ["baseline", "live"]
        baseline = lines(page, LOSS)["baseline"]
        assert len(baseline["xs"]) <= 2000 and 40.0 in baseline["ys"]  # spike kept
        assert attr(page, LOSS, "data-raw") == "false"

        # 3. the NaN at step 500 is a mark, not a silent gap; the alert's onset is a line
        wait_for(page, f"(t) => (({CHART})(t).dataset.nonfinite|0) > 0", LOSS)
        marks = {m["label"]: m["marks"] for m in page.evaluate(DRAWN, LOSS)["nonfinite"]}
        assert [NAN_STEP, "nan"] in marks["baseline"]
        wait_for(page, f"(t) => ({DRAWN})(t).alerts.length > 0", LOSS)
        assert [a["step"] for a in page.evaluate(DRAWN, LOSS)["alerts"]] == [NAN_STEP]
        # the listing read only the ends of baseline's file; once loaded, val/acc shows up
        wait_for(page, f"() => !!({CHART})('val/acc')")
        snapshot_row = page.locator("#snapshots tr[data-snapshot='fc1.weight']")
        assert snapshot_row.count() == 1 and snapshot_row.locator("svg rect").count() > 5
        # the panel's order: loss, learning rate, other train/ tags (the live run's
        # train/lr), then val/
        assert page.evaluate(ORDER) == [LOSS, "train/learning_rate", "train/lr", "val/acc"]
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / "viewer.png"), full_page=True)

        # 4. box-zoom with the mouse, twice (50k steps span the chart): first to steps
        # 0..4000, still downsampled, then to ~380..620, where the page gets raw points
        drag(page, LOSS, 0, 4000)
        wait_for(
            page,
            f"""(t) => {{ const d = ({DRAWN})(t);
                  const b = d.lines.find((l) => l.label === 'baseline');
                  return b && Math.max(...b.xs) <= 4100; }}""",
            LOSS,
        )
        assert attr(page, LOSS, "data-raw") == "false"
        assert attr(page, LOSS, "data-zoomed") == "1"
        drag(page, LOSS, 380, 620)
        wait_for(page, f"(t) => ({CHART})(t).dataset.raw === 'true'", LOSS)
        zoomed = lines(page, LOSS)["baseline"]
        lo, hi = min(zoomed["xs"]), max(zoomed["xs"])
        assert 360 <= lo <= 400 and 600 <= hi <= 640
        assert zoomed["xs"] == list(range(lo, hi + 1))  # every step: raw points
        assert zoomed["ys"][zoomed["xs"].index(NAN_STEP)] is None
        marks = {m["label"]: m["marks"] for m in page.evaluate(DRAWN, LOSS)["nonfinite"]}
        assert marks["baseline"] == [[NAN_STEP, "nan"]]
        x_range = page.evaluate(DRAWN, LOSS)["xRange"]
        assert lo - 1 <= x_range[0] and x_range[1] <= hi + 1  # the axis shows the zoom
        page.screenshot(path=str(shots / "viewer-zoom.png"))

        # 5. smoothing: the page's EMA is msmon_nb.metrics.decimate.ema on the same points
        page.locator("#smooth").fill("0.9")
        wait_for(page, f"(t) => ({LINES})([t, 'smoothed']).length > 0", LOSS)
        raw_ys = lines(page, LOSS)["baseline"]["ys"]
        smoothed = lines(page, LOSS, "smoothed")["baseline"]["ys"]
        expected = ema(np.array([np.nan if v is None else v for v in raw_ys]), 0.9)
        assert len(smoothed) == len(expected)
        for got, want in zip(smoothed, expected, strict=True):
            assert (got is None and not np.isfinite(want)) or got == pytest.approx(want, rel=1e-12)
        # log axis; double-click returns to the whole run
        page.select_option("#yscale", "log")
        wait_for(page, f"(t) => ({CHART})(t).dataset.scale === 'log'", LOSS)
        box = page.evaluate(DRAG_BOX, [LOSS, 450, 550])
        page.mouse.dblclick((box["x0"] + box["x1"]) / 2, (box["y0"] + box["y1"]) / 2)
        wait_for(
            page,
            f"""(t) => {{ const b = ({DRAWN})(t).lines.find((l) => l.label === 'baseline');
                  return b && Math.max(...b.xs) > 40000; }}""",
            LOSS,
        )
        assert attr(page, LOSS, "data-zoomed") == "0"
        assert problems == []
    finally:
        writer.kill()
        writer.wait()


def test_chart_order_is_the_panels_on_the_demo_and_a_mindspore_run(
    browser, serve, tmp_path, mindspore_run
):
    """The demo's run (msmon demo, real training) and SummaryRecord's own files."""
    import shutil

    subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "demo", "--steps", "60", "--no-view",
         "--dir", str(tmp_path / "demo")],
        check=True, capture_output=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    from msmon_nb import load_runs
    from msmon_nb.metrics.charts import plan_charts

    (demo,) = load_runs(tmp_path / "demo")
    expected = [c.tags[0] for c in plan_charts(demo.tags(), placeholders=False)]
    assert expected[:4] == [LOSS, "train/grad_norm", "train/learning_rate", "train/throughput"]
    server, _ = serve(tmp_path / "demo")
    page, problems = open_page(browser)
    page.goto(server.url)
    wait_for(page, "(n) => document.querySelectorAll('#charts .msmon-chart').length === n",
             len(expected))  # fmt: skip
    assert page.evaluate(ORDER) == expected
    assert "train/global_step" not in page.evaluate(ORDER)
    for tag in expected:  # every chart drew up to the run's last step of its tag
        wait_for(page, f"(t) => (({CHART})(t).dataset.points|0) > 0", tag)
        assert int(attr(page, tag, "data-last-step")) == int(demo.scalars(tag).steps[-1])
    page.screenshot(path=str((DOCS or tmp_path) / "viewer-demo.png"), full_page=True)

    shutil.copytree(mindspore_run, tmp_path / "ms" / "ms_run")
    server, _ = serve(tmp_path / "ms")
    page.goto(server.url)
    wait_for(page, "() => document.querySelectorAll('#charts .msmon-chart').length === 2")
    assert page.evaluate(ORDER) == ["loss", "acc"]
    wait_for(page, f"(t) => ({CHART})(t).dataset.lastStep === '30'", "loss")
    assert problems == []


RANK_STEPS, DEAD_AFTER, SLOW_FROM = 300, 179, 120


@pytest.fixture
def ranked_base(tmp_path):
    """A 2-rank job: rank 1 straggles from step 120 and its process dies after step 179."""
    from tests.support.synth import write_ranked_run

    rng = np.random.default_rng(1)
    columns = {}
    for rank, n in ((0, RANK_STEPS), (1, DEAD_AFTER + 1)):
        s = np.arange(n)
        columns[rank] = {
            LOSS: 2.0 * np.exp(-s / 100) + 0.3 + 0.08 * rng.standard_normal(n),
            "train/grad_norm": 1.0 + 0.5 * np.exp(-s / 150),
            "train/step_time": np.where((rank == 1) & (s >= SLOW_FROM), 0.5, 0.1)
            + 0.003 * rng.standard_normal(n),
        }
    write_ranked_run(tmp_path / "job", columns, status={1: "running"}, pid=2**22 + 1)
    return tmp_path


def test_ranks_as_lines_or_band_with_rank_alerts(browser, ranked_base, serve, tmp_path):
    shots = DOCS or tmp_path
    server, _ = serve(ranked_base)
    page, problems = open_page(browser)
    page.goto(server.url)
    names = f"(t) => (({DRAWN})(t)?.lines || []).map((l) => l.label).sort().join('|')"

    # 1. the run list shows both ranks with their last step and status; rank 1 is flagged
    row = page.locator("tr[data-ranks-of='job']")
    wait_for(
        page, "() => document.querySelectorAll(\"[data-ranks-of='job'] li.rank\").length === 2"
    )
    rank0, rank1 = row.locator("li.rank[data-rank='0']"), row.locator("li.rank[data-rank='1']")
    assert "step 299" in rank0.inner_text() and rank0.get_attribute("data-status") == "finished"
    assert "step 179" in rank1.inner_text() and rank1.get_attribute("data-status") == "interrupted"
    assert "flagged" in rank1.get_attribute("class") and "flagged" not in rank0.get_attribute(
        "class"
    )
    assert "1 stopped" in row.locator("summary").inner_text()

    # 2. two ranks start as one line each, in the run's colour family
    wait_for(page, f"(t) => ({names})(t) === 'job rank 0|job rank 1'", LOSS)
    drawn = lines(page, LOSS)
    assert max(drawn["job rank 0"]["xs"]) == RANK_STEPS - 1
    assert max(drawn["job rank 1"]["xs"]) == DEAD_AFTER
    assert page.evaluate(LINES, [LOSS, "lo"]) == []

    # 3. rank alerts are onset lines labelled with their rank: rank_stopped on every
    # chart, the straggler on train/step_time
    has_alert = f"(t) => (({DRAWN})(t)?.alerts || []).length > 0"
    wait_for(page, has_alert, "train/step_time")
    marks = page.evaluate(DRAWN, "train/step_time")["alerts"]
    assert [m["label"] for m in marks] == ["rank 1", "rank 1"]
    steps = sorted(m["step"] for m in marks)
    assert SLOW_FROM <= steps[0] <= SLOW_FROM + 2 and DEAD_AFTER <= steps[1] <= RANK_STEPS - 1
    wait_for(page, has_alert, LOSS)
    marks = page.evaluate(DRAWN, LOSS)["alerts"]
    assert [m["label"] for m in marks] == ["rank 1"] and marks[0]["step"] == steps[1]
    kinds = page.locator("#alerts tbody tr").evaluate_all(
        "(rows) => rows.map((r) => [r.dataset.kind, r.dataset.rank])"
    )
    assert sorted(kinds) == [["rank_stopped", "1"], ["straggler", "1"]]

    # 4. the toggle switches the run to a band: the mean line and the ranks' min..max
    row.locator(".rank-mode button[data-mode='band']").click()
    wait_for(page, f"(t) => ({names})(t) === 'job max|job mean of 2 ranks|job min'", LOSS)
    (mean,) = lines(page, LOSS).values()
    (low,) = lines(page, LOSS, "lo").values()
    (high,) = lines(page, LOSS, "hi").values()
    assert mean["xs"] == low["xs"] == high["xs"] and len(mean["xs"]) == RANK_STEPS
    for m, lo, hi in zip(mean["ys"], low["ys"], high["ys"], strict=True):
        assert lo <= m <= hi
    assert any(hi - lo > 0.05 for lo, hi in zip(low["ys"], high["ys"], strict=True))
    assert row.locator("button[data-mode='band']").get_attribute("aria-pressed") == "true"
    assert row.locator("button[data-mode='lines']").get_attribute("aria-pressed") == "false"
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / "viewer-ranks.png"), full_page=True)

    # 5. and back to one line per rank
    row.locator(".rank-mode button[data-mode='lines']").click()
    wait_for(page, f"(t) => ({names})(t) === 'job rank 0|job rank 1'", LOSS)
    assert page.evaluate(LINES, [LOSS, "lo"]) == []
    assert problems == []
