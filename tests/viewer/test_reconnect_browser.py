"""A page that loses its connection for 10 s during a live run comes back with every point
once (issue 46.2), in real headless Chromium.

A thread writes a run with msmon_nb's own ``EventWriter`` at a steady rate; the page
reaches the viewer through a relay the test cuts (``tests/support/cutproxy.py``: open
connections closed, new ones closed on arrival) for 10 s, during which the run ends. The
browser's ``EventSource`` retries and, once the network is back, sends the last event id
it saw: the stream replays what happened meanwhile and the page fetches the points. What
is checked is read from the page: its own state (``window.msmon.state``) and what the
loss chart draws (``msmonChart.drawn()``). Before the stream read ``Last-Event-ID``, the
page came back with the points it had when the network went, and nothing said so.
"""

from __future__ import annotations

import threading
import time

import pytest

from msmon_nb.events.writer import EventWriter
from tests.support.cutproxy import cut_proxy
from tests.viewer.test_browser import CHART, LOSS, browser, open_page, wait_for  # noqa: F401

pytestmark = pytest.mark.slow
OUTAGE_SECS = 10.0
RUN = "live"

# the steps the page holds for the loss of RUN, as its state has them and as drawn
STATE_STEPS = f"""() => {{
  for (const c of window.msmon.state.charts.values()) {{
    const d = c.data.get("{RUN}\\t{LOSS}");
    if (d) return Array.from(d.series.steps);
  }}
  return null;
}}"""
DRAWN_STEPS = f"""() => {{
  const el = ({CHART})("{LOSS}");
  const line = el && el.msmonChart.drawn().lines.find((l) => l.role === "line");
  return line ? line.xs : null;
}}"""


class Writer(threading.Thread):
    """Writes ``train/loss`` for steps 0, 1, 2... every ``pause`` s, each step flushed
    (on disk at once, as a live run's are) until ``stop`` is set; ``last`` is the last
    step written."""

    def __init__(self, run_dir, pause: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.pause = run_dir, pause
        self.stop = threading.Event()
        self.last = -1

    def run(self) -> None:
        with EventWriter(self.run_dir, flush_secs=0.05) as writer:
            step = 0
            while not self.stop.is_set():
                writer.add_scalars(step, {LOSS: 1.0 / (step + 1)})
                writer.flush()
                self.last = step
                step += 1
                time.sleep(self.pause)


@pytest.mark.parametrize("restart", [False, True], ids=["same-viewer", "viewer-restarted"])
def test_a_page_cut_off_for_10_s_while_the_run_ends_has_every_point_once(
    browser,  # noqa: F811
    serve,
    tmp_path,
    restart,
):
    """``restart``: the viewer is stopped and another started during the cut, so the
    page's last event id is a stranger's: the stream says it cannot resume and the page
    reloads everything it shows."""
    writer = Writer(tmp_path / RUN)
    writer.start()
    try:
        while writer.last < 5:
            time.sleep(0.05)
        server, _ = serve(tmp_path)
        with cut_proxy(server.server_address[:2]) as proxy:
            page, problems = open_page(browser)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"http://127.0.0.1:{proxy.port}/")
            wait_for(page, "() => document.querySelector('#live').textContent === 'live'")
            # the live tail works: the chart follows the run before the cut
            wait_for(page, f"() => (({STATE_STEPS})() || []).length > 20", timeout=20_000)
            proxy.cut()
            wait_for(page, "() => document.querySelector('#live').textContent === 'offline'")
            before = page.evaluate(STATE_STEPS)
            time.sleep(OUTAGE_SECS / 2)
            writer.stop.set()  # the run ends while the page is cut off
            writer.join(10)
            last = writer.last
            if restart:
                server.stop()
                server, _ = serve(tmp_path)
                proxy.target = server.server_address[:2]
            time.sleep(OUTAGE_SECS / 2)
            assert proxy.refused > 0  # the browser did try to reconnect, and failed
            assert page.evaluate("() => document.querySelector('#live').textContent") == "offline"
            held = page.evaluate(STATE_STEPS)
            assert held == before and held[-1] < last - 50  # nothing came in meanwhile
            proxy.restore()
            wait_for(page, "() => document.querySelector('#live').textContent === 'live'")
            # every step once, in order, in the page's data and in the line it draws
            everything = list(range(last + 1))
            deadline = time.monotonic() + 15
            while (steps := page.evaluate(STATE_STEPS)) != everything:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert steps == everything, (len(steps), steps[-3:], last)
            assert page.evaluate(DRAWN_STEPS) == everything
            resumed = page.evaluate("() => document.querySelector('#live').dataset.resumed")
            assert resumed == str(not restart).lower()
            # the browser logs each request the cut refused; nothing else went wrong
            network = "Failed to load resource: net::"
            assert [p for p in problems if not p.startswith(network)] == [], problems
    finally:
        writer.stop.set()
        writer.join(10)
