"""The live panel's cost and liveness, measured where users see it.

    python bench/panel.py [--blocks 6] [--secs 10] [--points 1000000] [--skip-browser]
                          [--modules 20]

1. Kernel side, in a real kernel (jupyter_client; this script answers the panel's hello
   like a page would, so the panel stays in browser mode): the demo MLP trained for
   ``--secs`` seconds per ``%%msmonitor`` cell, alternating blocks with and without the
   panel (``--no-panel``) in one kernel. Prints steps/s of both side by side (median and
   spread), the kernel time the panel took as a share of the cell's wall time (measured
   inside, every boundary call timed), messages and bytes sent per second.
   Targets: panel share <= 0.2 %; steps/s with the panel within noise of without.
2. In a real JupyterLab in headless Chromium: a cell records ``--points`` points per
   series as fast as ``Monitor.step`` goes; the page is sampled every 0.1 s. Prints how
   often the status line changed, the age of the newest step each chart shows (against
   the wall time the run's event file holds for the next step), when the first chart
   appeared after the first step, and the page's time per update with up to
   ``--points`` recorded points per series. Targets: status >= 2/s, age <= 1 s, first
   chart <= 1 s, page update <= 16 ms, bytes/s bounded (independent of run length).
3. In headless Chromium, the page's draw of activations alone: ``--modules`` modules x 5
   statistics x ``--draw-points`` points each, drawn as the heatmap (``MsmonHeatmap.set``,
   what the panel does on each update that brings activations) and as what it replaced
   (a line chart per statistic, its first 6 modules: ``MsmonChart.set``), alternating
   blocks in one page. Prints the median ms per draw of each with its spread and the ratio.
   ``--modules N`` in part 2 adds N modules' activation statistics (``act/m<k>/<stat>``, 5 each)
   to every step: the page then also draws the activations heatmap (module x step) on
   each update, and the same figures say what it costs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_v", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETUP = """import os, time
os.environ["GLOG_v"] = "3"
import mindspore as ms
from msmon_nb.demo import build, make_data
from msmon_nb.notebook.session import SESSION
data = make_data()
net, loss_fn, opt = build(steps=10**7)
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
X, Y = ms.Tensor(data.x[:64]), ms.Tensor(data.y[:64])
grad_fn(X, Y)
%load_ext msmon_nb"""

CELL = """%%msmonitor --dir {base} --run {run} {flag}
t0 = time.perf_counter(); n = 0
while time.perf_counter() - t0 < {secs}:
    loss, grads = grad_fn(X, Y)
    opt(grads)
    n += 1
rate = n / (time.perf_counter() - t0)  # the loop alone: not the cell's start and end
"""

REPORT = """p = SESSION.last_panel
print("STEPS", rate, end=" ")
if p is not None:
    print("PANEL", p.kernel_fraction, p.messages, p.bytes_sent, p.kernel_time,
          p.costs["pump"], p.costs["send"], p.finish_secs, end="")
print()"""


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4g} [{min(xs):.4g}-{max(xs):.4g}]"


class Page:
    """Answers the panel's hello like the browser would; counts what it receives."""

    def __init__(self, kc) -> None:
        self.kc = kc

    def run(self, code: str, timeout: float = 600) -> str:
        msg_id = self.kc.execute(code)
        out = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and "_anywidget_id" in content["data"].get("state", {}):
                data = {"method": "custom", "content": {"type": "hello"}}
                self.kc.shell_channel.send(
                    self.kc.session.msg("comm_msg", {"comm_id": content["comm_id"], "data": data})
                )
            elif kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(content["traceback"]))
            elif (
                kind == "status"
                and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_id") == msg_id
            ):
                return "".join(out)
        raise TimeoutError(code)


def kernel_side(blocks: int, secs: float) -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    page = Page(kc)
    rates: dict[str, list[float]] = {"panel": [], "no panel": []}
    shares, msg_rates, byte_rates, parts, finishes = [], [], [], [], []
    try:
        page.run(SETUP)
        with tempfile.TemporaryDirectory() as base:
            for block in range(blocks):
                order = ("panel", "no panel") if block % 2 == 0 else ("no panel", "panel")
                for mode in order:
                    flag = "" if mode == "panel" else "--no-panel"
                    page.run(CELL.format(base=base, run=f"b{block}{mode[0]}", flag=flag, secs=secs))
                    words = page.run(REPORT).split()
                    rates[mode].append(float(words[1]))
                    if mode == "panel":
                        shares.append(float(words[3]))
                        msg_rates.append(float(words[4]) / secs)
                        byte_rates.append(float(words[5]) / secs)
                        parts.append((float(words[7]) / secs, float(words[8]) / secs))
                        finishes.append(float(words[9]))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(f"\n1. kernel side: {blocks} blocks of {secs:g} s cells, demo MLP, alternating")
    print(f"   steps/s with panel     {spread(rates['panel'])}")
    print(f"   steps/s without panel  {spread(rates['no panel'])}")
    ratio = statistics.median(rates["panel"]) / statistics.median(rates["no panel"])
    print(f"   ratio (panel / none)   {ratio:.3f}")
    print(
        f"   panel kernel time      {spread([100 * s for s in shares])} % of wall (target <= 0.2)"
    )
    pump, send = (spread([100 * p[i] for p in parts]) for i in (0, 1))
    print(f"     of which: widget messages in {pump} %, updates out {send} %")
    print(f"   messages/s {spread(msg_rates)}, bytes/s {spread(byte_rates)}")
    print(f"   once, after the loop: final picture and state {spread(finishes)} s")


BIG = """%%msmonitor --dir {base} --run big
import msmon_nb.monitor as _m
mon = _m.active()
acts = {{f"act/m{{k}}/{{s}}": 1.0 + k for k in range({modules})
        for s in ("norm", "max_abs", "mean", "nonfinite", "zero_frac")}}
for i in range({points}):
    mon.step(loss=1.0 / (1 + i * 1e-4), lr=1e-3, grads=None,
             **{{t: v * (1 + (i % 97) * 1e-3) for t, v in acts.items()}})
"""

SAMPLE = """() => {
  const root = document.querySelector('.msmon-panel');
  const status = document.querySelector('.msmon-status');
  const chart = document.querySelector('[data-msmon-tag="train/loss"]');
  return {status: status ? status.textContent : '',
          last: chart ? Number(chart.dataset.lastStep) : -1,
          ms: root ? Number(root.dataset.updateMs || 'NaN') : NaN,
          points: root ? Number(root.dataset.points || '0') : 0,
          heat: Number(document.querySelector('.msmon-heatmap')?.dataset.cols || '0')};
}"""


def browser_side(points: int, modules: int = 0) -> None:
    from msmon_nb.events.runs import load_run
    from tests.support.jupyter_app import cell_done_js, jupyter_page, run_all, write_notebook

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_notebook(
            root / "big.ipynb",
            [
                "%load_ext msmon_nb",
                BIG.format(base=root / "summary", points=points, modules=modules),
            ],
        )
        samples = []
        with jupyter_page(root, "big.ipynb") as page:
            run_all(page)
            page.wait_for_selector(".msmon-status", timeout=120_000)
            while not page.evaluate(cell_done_js(1)):
                s = page.evaluate(SAMPLE)
                s["wall"] = time.time()
                samples.append(s)
                time.sleep(0.1)
        run = load_run(root / "summary" / "big")
    scalars = run.scalars("train/loss")
    walls = dict(zip(scalars.steps.tolist(), scalars.wall_times.tolist(), strict=True))
    live = [s for s in samples if "running" in s["status"]]
    if not live:
        raise SystemExit(
            f"the cell ended before the page showed it running ({len(samples)} samples, "
            f"{points} points): raise --points"
        )
    # the step number, not the clock the page ticks by itself
    steps = [(s["wall"], s["status"].split("step ", 1)[-1].split(" ", 1)[0]) for s in live]
    changes = [b[0] for a, b in itertools.pairwise(steps) if a[1] != b[1]]
    gaps = np.diff(changes) if len(changes) > 1 else np.array([np.inf])
    ages = []
    for s in live:
        nxt = walls.get(s["last"] + 1)
        ages.append(max(0.0, s["wall"] - nxt) if nxt is not None and s["last"] >= 0 else np.nan)
    first_shown = next((s["wall"] for s in live if s["last"] >= 0), np.nan)
    ms = [s["ms"] for s in live if np.isfinite(s["ms"])]
    print(f"\n2. JupyterLab, headless Chromium: {points} points per series recorded in one cell")
    if modules:
        heat = sum(1 for s in live if s["heat"]) / len(live)
        print(
            f"   with {modules} modules' activations (5 stats each): heatmap drawn in "
            f"{100 * heat:.0f} % of samples, {max(s['heat'] for s in live)} columns at most"
        )
    print(
        f"   status step changed every {np.median(gaps):.2f} s (median), "
        f"{np.max(gaps):.2f} s (max): {1 / np.median(gaps):.1f}/s (target >= 2/s)"
    )
    print(
        f"   newest step shown is {np.nanmedian(ages):.2f} s old (median), "
        f"{np.nanmax(ages):.2f} s (max) (target <= 1 s)"
    )
    print(f"   first chart {first_shown - walls[0]:.2f} s after the first step (target <= 1 s)")
    print(
        f"   page time per update {np.median(ms):.1f} ms (median), {np.max(ms):.1f} ms (max), "
        f"{max(s['points'] for s in live)} points held for "
        f"{len(run.tags())} series (target <= 16 ms)"
    )


DRAW = """async ([modules, points, blocks, reps]) => {
  const rows = [...Array(modules).keys()].map((k) => `m${k}`);
  const stats = ["norm", "max_abs", "mean", "nonfinite", "zero_frac"];
  const tags = rows.flatMap((r) => stats.map((s) => `act/${r}/${s}`));
  const heat = new MsmonHeatmap({title: "act", tags, group: "act", rows, stats, log: true});
  document.body.append(heat.el);
  const xs = [...Array(points).keys()].map((i) => 10 * i);
  const series = (k, s) => xs.map((i) => (1 + k) * (1 + s) * (1 + (i % 97) * 1e-3));
  const data = rows.map((row, k) => ({row, xs, ys: series(k, 0), nonfinite: [], flagged: []}));
  const lines = stats.map((s, si) => {
    const first = rows.slice(0, 6);
    const c = new MsmonChart({title: `act ${s}`, tags: first.map((r) => `act/${r}/${s}`)});
    document.body.append(c.el);
    return [c, rows.slice(0, 6).map((r, k) => ({label: r, tag: `act/${r}/${s}`,
      color: MSMON_COLORS[k], xs, ys: series(k, si), nonfinite: []}))];
  });
  const out = {heatmap: [], lines: []};
  // uPlot redraws in a microtask queued by setData: awaited, so that its drawing counts
  const time = async (f) => {
    const t0 = performance.now();
    for (let r = 0; r < reps; r++) {
      f();
      await new Promise((done) => queueMicrotask(done));
    }
    return (performance.now() - t0) / reps;
  };
  for (let b = 0; b < blocks; b++) {
    const arms = b % 2 ? ["lines", "heatmap"] : ["heatmap", "lines"];
    for (const arm of arms) {
      out[arm].push(arm === "heatmap"
        ? await time(() => heat.set(data, {width: 1200}))
        : await time(() => { for (const [c, s] of lines) c.set(s, {width: 590}); }));
    }
  }
  return out;
}"""


def draw_side(modules: int, points: int, blocks: int) -> None:
    import shutil

    from playwright.sync_api import sync_playwright

    from tests.viewer.test_browser import CHROMIUM_ARGS

    static = ROOT / "msmon_nb" / "static"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.set_content("<html><body></body></html>")
        for name in ("uPlot.iife.min.js", "chart.js", "heatmap.js"):
            page.add_script_tag(path=str(static / name))
        got = page.evaluate(DRAW, [modules, points, blocks, 5])
        browser.close()
    heat, lines = got["heatmap"], got["lines"]
    print(
        f"\n3. headless Chromium, {modules} modules x 5 stats x {points} points, "
        f"{blocks} alternating blocks of 5 draws"
    )
    print(f"   heatmap (every module, 1 stat)     {spread(heat)} ms per draw")
    print(f"   line charts it replaced (5 x 6)    {spread(lines)} ms per draw")
    ratio = statistics.median(heat) / statistics.median(lines)
    print(f"   ratio (heatmap / lines)            {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--secs", type=float, default=10.0)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--skip-kernel", action="store_true")
    parser.add_argument("--modules", type=int, default=0, help="activations of N modules")
    parser.add_argument("--draw-modules", type=int, default=20)
    parser.add_argument("--draw-points", type=int, default=4000)
    parser.add_argument("--draw-blocks", type=int, default=10)
    parser.add_argument("--skip-draw", action="store_true")
    args = parser.parse_args()
    if not args.skip_kernel:
        kernel_side(args.blocks, args.secs)
    if not args.skip_browser:
        browser_side(args.points, args.modules)
    if not args.skip_draw:
        draw_side(args.draw_modules, args.draw_points, args.draw_blocks)


if __name__ == "__main__":
    main()
