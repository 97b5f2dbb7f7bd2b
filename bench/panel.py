"""Panel drawing cost: one redraw with 1,000,000 points per series, and the share of a
30-second training cell spent drawing.

    python bench/panel.py [--points 1000000] [--train-secs 30]

1. Four core series of ``--points`` points each: median time of a redraw while the axes
   limits hold (the common case: lines blitted on cached axes, PNG encoded), of a redraw
   where one chart's limits changed (that axes alone re-laid out) and of a full redraw
   (every chart's limits changed). Target: a redraw <= 30 ms.
2. The demo MLP trained for ``--train-secs`` under ``Monitor.watch()`` with a ``Panel``
   attached exactly as ``%%msmonitor`` attaches it (outside a kernel, so widget
   messages go nowhere): drawing time / wall time. Target <= 1 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

import numpy as np

from msmon_nb.metrics.series import Series
from msmon_nb.notebook.panel import Panel
from msmon_nb.notebook.render import ChartRenderer

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput")


def redraw_cost(points: int, rounds: int = 30) -> None:
    rng = np.random.default_rng(0)
    series = {}
    for tag in TAGS:
        s = Series()
        s.extend(np.arange(points), np.abs(rng.normal(size=points)) + 0.1, np.zeros(points))
        series[tag] = s
    renderer = ChartRenderer()
    t0 = time.perf_counter()
    renderer.render(series)
    first = time.perf_counter() - t0
    fast, full, one = [], [], []
    for i in range(rounds):
        if i % 5 == 4:
            renderer._limits = [None] * len(renderer._limits)  # force a re-layout
            target = full
        elif i % 5 == 2:
            renderer._limits[2] = None  # one chart's limits moved (a warmup, say)
            target = one
        else:
            target = fast
        t0 = time.perf_counter()
        renderer.render(series)
        target.append(time.perf_counter() - t0)
    print(f"redraw, 4 series x {points:,} points:")
    print(f"  first draw (figure build, all points decimated): {first * 1e3:.0f} ms")
    fast_ms, full_ms = statistics.median(fast) * 1e3, statistics.median(full) * 1e3
    print(f"  redraw, limits unchanged (median of {len(fast)}): {fast_ms:.1f} ms (target <= 30 ms)")
    one_ms = statistics.median(one) * 1e3
    print(f"  redraw, one chart's limits changed (median of {len(one)}): {one_ms:.1f} ms")
    print(f"  redraw, every chart's limits changed (median of {len(full)}): {full_ms:.1f} ms")


def training_share(train_secs: float) -> None:
    import mindspore as ms

    from msmon_nb.demo import batches, build, make_data
    from msmon_nb.monitor import Monitor

    data = make_data()
    steps = 100_000
    net, loss_fn, opt = build(steps=steps)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    with tempfile.TemporaryDirectory() as base:
        mon = Monitor(save_dir=base, run_name="panel_bench")
        panel = Panel("panel_bench", str(mon.run_dir))
        panel.attach(mon)
        panel.warm_up()
        panel._started = time.perf_counter()
        t0 = time.perf_counter()
        with mon, mon.watch():
            for x, y in batches(data, 64, steps):
                _, grads = grad_fn(x, y)
                opt(grads)
                if time.perf_counter() - t0 >= train_secs:
                    break
        wall = time.perf_counter() - t0
        print(f"training cell of {wall:.1f} s, {mon.step_count} steps, panel attached:")
        print(
            f"  {panel.draws} redraws, {panel.draw_time * 1e3:.0f} ms drawing = "
            f"{panel.draw_time / wall:.2%} of wall time (target <= 1 %)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--train-secs", type=float, default=30.0)
    args = parser.parse_args()
    redraw_cost(args.points)
    training_share(args.train_secs)


if __name__ == "__main__":
    main()
