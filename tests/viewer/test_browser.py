"""The page in real headless Chromium: live tail, two runs, box-zoom to raw points, NaN marker.

Debian's ``chromium`` driven by Playwright (``executable_path``; ``playwright install``
cannot download browsers here). Screenshots go to ``docs/`` and the README shows one.
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
from tests.viewer.test_live import WRITER

# screenshots for the README: written to docs/ only when asked (MSMON_UPDATE_DOCS=1), so a
# test run leaves the work tree clean
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

# JavaScript helpers run in the page. Traces carry ``meta``: series, smoothed,
# nonfinite, alert.
TRACES = """([tag, meta]) => {
  const gd = document.getElementById('chart-' + tag);
  if (!gd || !gd.data) return [];
  return gd.data.filter((t) => t.meta === meta)
    .map((t) => ({name: t.name, x: Array.from(t.x), y: Array.from(t.y), text: t.text || null}));
}"""
DRAG_BOX = """([tag, x0, x1]) => {
  const gd = document.getElementById('chart-' + tag);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return {
    x0: box.left + xa._offset + xa.l2p(x0), x1: box.left + xa._offset + xa.l2p(x1),
    y0: box.top + ya._offset + 5, y1: box.top + ya._offset + ya._length - 5,
  };
}"""


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


def test_live_run_two_runs_zoom_raw_and_nan_marker(browser, base, serve, tmp_path):
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

        # 1. the running run is selected at start and its chart gains points live
        wait_for(page, "() => document.querySelector('#live').textContent === 'live'")
        wait_for(page, "(t) => (document.getElementById('chart-' + t)?.dataset.points|0) > 0", LOSS)
        first = page.evaluate(TRACES, [LOSS, "series"])
        assert [t["name"] for t in first] == ["live"]
        last_x = max(first[0]["x"])
        wait_for(
            page,
            """([t, x]) => {
                 const gd = document.getElementById('chart-' + t);
                 const s = gd.data.find((d) => d.meta === 'series' && d.name === 'live');
                 return s && Math.max(...s.x) > x;
               }""",
            [LOSS, last_x],
            timeout=5_000,
        )
        grown = page.evaluate(TRACES, [LOSS, "series"])[0]
        assert len(grown["x"]) > len(first[0]["x"])

        # 2. select a second run: both are compared on the same chart
        page.click("tr[data-run='baseline'] input[type=checkbox]")
        wait_for(
            page,
            """(t) => document.getElementById('chart-' + t).data
                      .filter((d) => d.meta === 'series').length === 2""",
            LOSS,
        )
        runs_drawn = sorted(t["name"] for t in page.evaluate(TRACES, [LOSS, "series"]))
        assert runs_drawn == ["baseline", "live"]
        baseline = next(
            t for t in page.evaluate(TRACES, [LOSS, "series"]) if t["name"] == "baseline"
        )
        assert len(baseline["x"]) <= 2000 and 40.0 in baseline["y"]  # spike kept when downsampled
        chart = page.locator(f"[id='chart-{LOSS}']")
        assert chart.get_attribute("data-raw") == "false"

        # 3. the NaN at step 500 is a marker, not a silent gap; the alert is marked too
        wait_for(
            page, "(t) => (document.getElementById('chart-' + t).dataset.nonfinite|0) > 0", LOSS
        )
        (marker,) = page.evaluate(TRACES, [LOSS, "nonfinite"])
        assert NAN_STEP in marker["x"] and "NAN at step 500" in " ".join(marker["text"])
        assert page.locator(f"[id='chart-{LOSS}'] .scatterlayer .trace .point").count() > 0
        wait_for(
            page,
            "(t) => document.getElementById('chart-' + t).data.some((d) => d.meta === 'alert')",
            LOSS,
        )
        (alert,) = page.evaluate(TRACES, [LOSS, "alert"])
        assert alert["x"] == [NAN_STEP]
        # the listing read only the ends of baseline's file; once loaded, val/acc shows up
        wait_for(page, "() => !!document.getElementById('chart-val/acc')")
        snapshot_row = page.locator("#snapshots tr[data-snapshot='fc1.weight']")
        assert snapshot_row.count() == 1 and snapshot_row.locator("svg rect").count() > 5
        shots.mkdir(exist_ok=True)
        page.screenshot(path=str(shots / "viewer.png"), full_page=True)

        # 4. box-zoom with the mouse, twice (50k steps span the chart): first to steps
        # 0..4000, still downsampled, then to ~380..620, where the page gets raw points
        drag(page, LOSS, 0, 4000)
        wait_for(
            page,
            """(t) => { const gd = document.getElementById('chart-' + t);
                        const s = gd.data.find((d) => d.name === 'baseline' && d.meta === 'series');
                        return s && Math.max(...s.x) <= 4100; }""",
            LOSS,
        )
        assert chart.get_attribute("data-raw") == "false"
        drag(page, LOSS, 380, 620)  # Plotly needs >= 20 px across to zoom x
        wait_for(page, "(t) => document.getElementById('chart-' + t).dataset.raw === 'true'", LOSS)
        zoomed = next(t for t in page.evaluate(TRACES, [LOSS, "series"]) if t["name"] == "baseline")
        lo, hi = min(zoomed["x"]), max(zoomed["x"])
        assert 360 <= lo <= 400 and 600 <= hi <= 640
        assert zoomed["x"] == list(range(lo, hi + 1))  # every step: raw points
        assert zoomed["y"][zoomed["x"].index(NAN_STEP)] is None
        (marker,) = page.evaluate(TRACES, [LOSS, "nonfinite"])
        assert marker["x"] == [NAN_STEP]
        page.screenshot(path=str(shots / "viewer-zoom.png"))

        # 5. smoothing and log scale act on the drawn charts
        page.locator("#smooth").fill("0.9")
        wait_for(
            page,
            "(t) => document.getElementById('chart-' + t).data.some((d) => d.meta === 'smoothed')",
            LOSS,
        )
        smoothed = page.evaluate(TRACES, [LOSS, "smoothed"])
        expected = page.evaluate(
            "(ys) => window.msmon.ema(ys, 0.9)",
            next(t for t in page.evaluate(TRACES, [LOSS, "series"]) if t["name"] == "baseline")[
                "y"
            ],
        )
        assert next(t for t in smoothed if t["name"] == "baseline")["y"] == expected
        page.select_option("#yscale", "log")
        wait_for(
            page,
            "(t) => document.getElementById('chart-' + t)._fullLayout.yaxis.type === 'log'",
            LOSS,
        )
        assert problems == []
    finally:
        writer.kill()
        writer.wait()


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
    series_names = """(t) => (document.getElementById('chart-' + t)?.data || [])
        .filter((d) => d.meta === 'series').map((d) => d.name).sort().join('|')"""

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
    wait_for(page, f"(t) => ({series_names})(t) === 'job rank 0|job rank 1'", LOSS)
    lines = {t["name"]: t for t in page.evaluate(TRACES, [LOSS, "series"])}
    assert max(lines["job rank 0"]["x"]) == RANK_STEPS - 1
    assert max(lines["job rank 1"]["x"]) == DEAD_AFTER
    assert page.evaluate(TRACES, [LOSS, "band"]) == []

    # 3. rank alerts are markers labelled with their rank: rank_stopped on every chart,
    # the straggler on train/step_time
    has_alert = (
        "(t) => (document.getElementById('chart-' + t)?.data || []).some((d) => d.meta === 'alert')"
    )
    wait_for(page, has_alert, "train/step_time")
    (marks,) = page.evaluate(TRACES, ["train/step_time", "alert"])
    assert marks["text"] == ["rank 1", "rank 1"]
    assert sorted(marks["x"]) == [SLOW_FROM + 2, RANK_STEPS - 1]  # confirmed at, stopped by
    wait_for(page, has_alert, LOSS)
    (marks,) = page.evaluate(TRACES, [LOSS, "alert"])
    assert marks["text"] == ["rank 1"] and marks["x"] == [RANK_STEPS - 1]
    hover = page.evaluate(
        "(t) => document.getElementById('chart-' + t).data"
        ".find((d) => d.meta === 'alert').hovertext",
        LOSS,
    )
    assert "job rank 1: rank 1 stopped writing after step 179" in hover[0]
    kinds = page.locator("#alerts tbody tr").evaluate_all(
        "(rows) => rows.map((r) => [r.dataset.kind, r.dataset.rank])"
    )
    assert sorted(kinds) == [["rank_stopped", "1"], ["straggler", "1"]]

    # 4. the toggle switches the run to a band: the mean line and the ranks' min..max
    row.locator(".rank-mode button[data-mode='band']").click()
    wait_for(page, f"(t) => ({series_names})(t) === 'job mean of 2 ranks'", LOSS)
    (mean,) = page.evaluate(TRACES, [LOSS, "series"])
    low, high = page.evaluate(TRACES, [LOSS, "band"])
    assert mean["x"] == low["x"] == high["x"] and len(mean["x"]) == RANK_STEPS
    for m, lo, hi in zip(mean["y"], low["y"], high["y"], strict=True):
        assert lo <= m <= hi
    assert any(hi - lo > 0.05 for lo, hi in zip(low["y"], high["y"], strict=True))
    assert row.locator("button[data-mode='band']").get_attribute("aria-pressed") == "true"
    assert row.locator("button[data-mode='lines']").get_attribute("aria-pressed") == "false"
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / "viewer-ranks.png"), full_page=True)

    # 5. and back to one line per rank
    row.locator(".rank-mode button[data-mode='lines']").click()
    wait_for(page, f"(t) => ({series_names})(t) === 'job rank 0|job rank 1'", LOSS)
    assert page.evaluate(TRACES, [LOSS, "band"]) == []
    assert problems == []
