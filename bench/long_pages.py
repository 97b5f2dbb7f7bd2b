"""The pages of ``bench/long.py``: the viewer drawing a long run, the live panel through a
long cell in JupyterLab, and the viewer's rank list on a 1,024-rank job.

Everything is measured in real headless Chromium (Debian's, through Playwright, as
tests/viewer and tests/notebook drive it); "drawn" is what the chart component says it
drew (``data-last-step`` on every chart, see ``msmon_nb/static/chart.js``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.viewer import Viewer, timed

MB = 1e6
MiB = 2**20
# true once every chart on the page has drawn its tag up to the run's last step there
ALL_DRAWN = """(last) => {
  const els = [...document.querySelectorAll('#charts [data-msmon-tag]')];
  return els.length > 0 && els.every((e) => {
    const want = last[e.dataset.msmonTag];
    return want === undefined || Number(e.dataset.lastStep) === want;
  });
}"""
PAGE_TAGS = "() => [...document.querySelectorAll('#charts [data-msmon-tag]')]" \
    ".map((e) => e.dataset.msmonTag)"  # fmt: skip
CHARTS = "() => document.querySelectorAll('#charts .msmon-chart').length"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def browser(pw):
    from tests.viewer.test_browser import CHROMIUM_ARGS, chromium_path

    return pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)


def viewer_draw_time(base: Path, run: str) -> tuple[float, int, list[str]]:
    """A fresh ``msmon view`` of ``base``; seconds from navigating to its page until every
    chart drew its last step, the number of charts, and the run's tags the page does not
    chart."""
    from playwright.sync_api import sync_playwright

    from msmon_nb.events.runs import load_run

    loaded = load_run(base / run)
    last = {t: int(loaded.scalars(t).steps[-1]) for t in loaded.tags()}
    viewer = Viewer(base, timeout=300)
    try:
        with sync_playwright() as pw:
            chromium = browser(pw)
            try:
                page = chromium.new_page(viewport={"width": 1500, "height": 950})
                t0 = time.perf_counter()
                page.goto(viewer.url)
                page.wait_for_function(ALL_DRAWN, arg=last, timeout=300_000, polling="raf")
                drawn = time.perf_counter() - t0
                charts = page.evaluate(CHARTS)
                missing = sorted(set(last) - set(page.evaluate(PAGE_TAGS)))
            finally:
                chromium.close()
    finally:
        viewer.close()
    return drawn, charts, missing


# --- 2. the live panel -------------------------------------------------------------------

BIG = """%%msmonitor --dir {base} --run long
import msmon_nb.monitor as _m
mon = _m.active()
for i in range({steps}):
    mon.step(loss=1.0 / (1 + i * 1e-4), lr=1e-3, grad_norm=0.5 + (i % 10) * 0.01,
             batch_size=16)
"""
REPORT = """from msmon_nb.notebook.session import SESSION
p = SESSION.last_panel
print("PANEL", p.kernel_fraction, p.messages, p.bytes_sent)"""
SAMPLE = """() => {
  const root = document.querySelector('.msmon-panel');
  const chart = document.querySelector('.msmon-panel [data-msmon-tag="train/loss"]');
  return {last: chart ? Number(chart.dataset.lastStep) : -1,
          ms: root ? Number(root.dataset.updateMs || 'NaN') : NaN};
}"""


def bench_panel(steps: int) -> None:
    """A long ``%%msmonitor`` cell in JupyterLab: the page's heap and redraw time along it."""
    from tests.support.jupyter_app import cell_done_js, jupyter_page, run_all, save, write_notebook

    print(f"2. the live panel in JupyterLab (headless Chromium): {steps:,} steps in one cell")
    print("   (fed by Monitor.step with synthetic values, faster than training)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        nb = root / "long.ipynb"
        write_notebook(nb, ["%load_ext msmon_nb", BIG.format(base=root / "s", steps=steps), REPORT])
        samples = []
        with jupyter_page(root, nb.name) as page:
            cdp = page.context.new_cdp_session(page)

            def heap() -> int:
                return int(cdp.send("Runtime.getHeapUsage")["usedSize"])

            start_heap = heap()
            run_all(page)
            page.wait_for_selector(".msmon-panel", timeout=120_000)
            while not page.evaluate(cell_done_js(1)):
                s = page.evaluate(SAMPLE)
                s["heap"] = heap()
                samples.append(s)
                time.sleep(0.5)
            page.wait_for_function(cell_done_js(2), timeout=120_000)
            time.sleep(2)  # the final picture and state reach the page
            end_heap = heap()
            cdp.send("HeapProfiler.collectGarbage")
            collected = heap()
            save(page)
        cells = json.loads(nb.read_text())["cells"]
        printed = "".join("".join(o.get("text", "")) for o in cells[2]["outputs"])
        words = printed.split("PANEL", 1)[1].split()
        share, messages, sent = float(words[0]), int(words[1]), int(words[2])
        saved = nb.stat().st_size
    live = [s for s in samples if s["last"] >= 0]
    if len(live) < 4:
        raise SystemExit(f"the page drew {len(live)} samples of the running cell: raise the steps")
    tenth = max(1, len(live) // 10)
    early, late = live[:tenth], live[-tenth:]

    def ms(part):
        return statistics.median([s["ms"] for s in part if s["ms"] == s["ms"]] or [float("nan")])

    print(
        f"   JS heap (JupyterLab + panel): {start_heap / MB:.1f} MB before the cell, "
        f"{early[0]['heap'] / MB:.1f} MB at step {early[0]['last']:,}, "
        f"{live[-1]['heap'] / MB:.1f} MB at step {live[-1]['last']:,}, "
        f"{end_heap / MB:.1f} MB at the end ({collected / MB:.1f} MB after a GC)"
    )
    print(f"   peak sampled: {max(s['heap'] for s in samples) / MB:.1f} MB over {len(samples)} "
          f"samples (goal <= 100 MB at the end)  {verdict(end_heap <= 100 * MB)}")  # fmt: skip
    print(
        f"   page time per update: {ms(early):.1f} ms (median, first tenth), "
        f"{ms(late):.1f} ms (median, last tenth; goal <= 30 ms)  {verdict(ms(late) <= 30)}"
    )
    print(
        f"   kernel time of the panel: {share * 100:.3f} % of the cell's wall time "
        f"(goal <= 0.2 %)  {verdict(share <= 0.002)}; {messages:,} messages, "
        f"{sent / MB:.1f} MB sent"
    )
    print(f"   saved notebook: {saved / 1e3:,.0f} kB")


# --- 3. 1,024 ranks ----------------------------------------------------------------------

RANK_LIST = """(job) => {
  const row = document.querySelector(`tr.ranks-row[data-ranks-of='${job}']`);
  if (!row) return null;
  const visible = (e) => e.checkVisibility();  // false inside a folded <details>
  const items = [...row.querySelectorAll('li.rank')];
  return {rows: items.length, shown: items.filter(visible).length,
          first: items.filter(visible).slice(0, 8).map((e) => Number(e.dataset.rank)),
          text: row.innerText.slice(0, 300)};
}"""


def bench_rank_page(data: Path, ranks: int, steps: int) -> None:
    """The viewer on ``ranks`` x ``steps``: merged chart cold and warm, memory, rank list."""
    from playwright.sync_api import sync_playwright

    from bench.ranks import STRAGGLER, TAGS, make_job

    base = data / "base"
    print(f"3. the viewer on {ranks:,} ranks x {steps:,} steps x {len(TAGS)} tags")
    make_job(base, ranks, steps)
    raw = ranks * steps * len(TAGS) * 12
    viewer = Viewer(base, timeout=600)
    try:
        while True:
            try:
                viewer.get("/api/runs")
                break
            except OSError:
                time.sleep(0.01)

        def merged(tag):
            return viewer.get("/api/scalars", run="job", tag=tag, rank="all", max_points=1000)

        cold, body = timed(lambda: merged("train/step_time"))
        outliers = [o["rank"] for o in body.get("outliers", [])]
        warm = statistics.median(timed(lambda: merged("train/step_time"))[0] for _ in range(20))
        peak = viewer.peak_memory()
        print(
            f"   merged chart (rank=all -> 1,000 points), fresh `msmon view`: cold "
            f"{cold:5.2f} s (goal <= 3 s) {verdict(cold <= 3)}; warm {warm * 1e3:5.1f} ms "
            f"median of 20 (goal <= 100 ms) {verdict(warm <= 0.1)}"
        )
        print(
            f"   viewer peak memory (VmHWM): {peak / MiB:,.0f} MiB "
            f"({peak / raw:.2f}x the raw scalar data, {raw / MiB:,.0f} MiB)"
        )
        print(f"   outlier ranks the server names on train/step_time: {outliers} "
              f"(planted: {min(STRAGGLER, ranks - 1)})")  # fmt: skip
        with sync_playwright() as pw:
            chromium = browser(pw)
            try:
                page = chromium.new_page(viewport={"width": 1500, "height": 950})
                t0 = time.perf_counter()
                page.goto(viewer.url)
                page.wait_for_function(
                    "() => [...document.querySelectorAll('#charts .msmon-chart')]"
                    ".some((e) => Number(e.dataset.points) > 0)",
                    timeout=300_000,
                )
                first = time.perf_counter() - t0
                page.wait_for_function(
                    f"(k) => ({RANK_LIST})('job')?.first.includes(k)",
                    arg=min(STRAGGLER, ranks - 1),
                    timeout=60_000,
                )
                listed = page.evaluate(RANK_LIST, "job")
            finally:
                chromium.close()
    finally:
        viewer.close()
    named_first = min(STRAGGLER, ranks - 1) in listed["first"][: max(1, len(outliers))]
    print(f"   page: first chart drawn {first:5.2f} s after navigation (warm viewer)")
    print(
        f"   rank list: {listed['rows']:,} rows in the page, {listed['shown']} shown; "
        f"first shown: {listed['first']}; the outlier first: {verdict(named_first)}; "
        f"not a row per rank: {verdict(listed['shown'] < ranks)}"
    )
