"""First calls of jit functions before, under and after ``mon.watch()`` (issue 42, item 5).

A notebook compiles two ``mindspore.jit`` functions in an earlier cell: (a) one that holds
no optimizer (``other``: a forward pass of the MLP) and (b) a train step (``value_and_grad``
+ ``nn.Momentum``), then runs a monitored cell that trains with (b) and calls (a) once,
then goes on unmonitored; and (c) a train cell (``nn.TrainOneStepCell``) driven by hand in
GRAPH_MODE, monitored for a few steps in the same way. For each the bench times the first
call before the watch (its compile), the first call under the watch and the first call
after it, in two arms:

* ``today``: what the watch did until this change -- MindSpore's whole jit compile cache
  emptied when the taps went on (the first jit call) and again when they went off, and
  the train cell's own compiled graphs dropped when they went off; reproduced by
  emptying them at those moments around today's watch;
* ``now``: the watch as it is (``collect.recompile``): only a graph that holds a tapped
  optimizer compiles again, once, under a compile key of its own (the cell's too).

Every repeat builds fresh functions (a fresh compile) and runs both arms, alternating
which goes first; medians over repeats. ``ratio`` is now / today (below 1: faster).

    GLOG_v=3 .venv/bin/python bench/compile.py [--repeats 5] [--hidden 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import numpy as np
from mindspore import nn

from msmon_nb.collect.hooks import compile_cache
from msmon_nb.monitor import Monitor

MOMENTS = ("before", "under", "after")


def build(hidden: int):
    """Fresh (other, train_step, batch): two new jit functions, compiled on first call."""
    net = nn.SequentialCell(
        [nn.Dense(64, hidden), nn.ReLU(), nn.Dense(hidden, hidden), nn.ReLU(), nn.Dense(hidden, 10)]
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def other(a):
        return net(a).argmax(-1)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    rng = np.random.default_rng(0)
    batch = (
        ms.Tensor(rng.normal(size=(32, 64)).astype(np.float32)),
        ms.Tensor(rng.integers(0, 10, size=32).astype(np.int32)),
    )
    return other, train_step, batch


def build_cell(hidden: int):
    """A fresh GRAPH_MODE train cell of the same MLP (compiled on its first call)."""
    net = nn.SequentialCell(
        [nn.Dense(64, hidden), nn.ReLU(), nn.Dense(hidden, hidden), nn.ReLU(), nn.Dense(hidden, 10)]
    )
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    out = fn(*args)
    (out[0] if isinstance(out, tuple) else out).asnumpy()  # wait for the result
    return time.perf_counter() - t0


def one_arm(arm: str, hidden: int, steps: int) -> dict[tuple[str, str], float]:
    """Seconds of each first call: {(function, moment): s}."""
    other, train_step, (x, y) = build(hidden)
    out = {("other", "before"): timed(other, x), ("step", "before"): timed(train_step, x, y)}
    with tempfile.TemporaryDirectory() as tmp:
        with Monitor(save_dir=tmp, log_interval=1) as mon, mon.watch():
            if arm == "today":
                compile_cache().clear()  # when the taps went on
            out["step", "under"] = timed(train_step, x, y)
            for _ in range(steps - 1):
                train_step(x, y)
            out["other", "under"] = timed(other, x)
        if arm == "today":
            compile_cache().clear()  # when they went off
    out["step", "after"] = timed(train_step, x, y)
    out["other", "after"] = timed(other, x)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        cell = build_cell(hidden)
        out["cell", "before"] = timed(cell, x, y)
        with tempfile.TemporaryDirectory() as tmp:
            with Monitor(save_dir=tmp, log_interval=1) as mon, mon.watch():
                out["cell", "under"] = timed(cell, x, y)
                for _ in range(steps - 1):
                    cell(x, y)
            if arm == "today":
                cell.compile_cache.clear()  # when they went off
        out["cell", "after"] = timed(cell, x, y)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="train steps under the watch")
    args = parser.parse_args()
    ms.set_seed(0)
    timings: dict[str, list[dict]] = {"today": [], "now": []}
    for r in range(args.repeats):
        for arm in ("today", "now") if r % 2 == 0 else ("now", "today"):
            timings[arm].append(one_arm(arm, args.hidden, args.steps))
    print(
        f"MindSpore {ms.__version__}, MLP 64-{args.hidden}-{args.hidden}-10, "
        f"{args.repeats} repeats alternated, medians of the first call in ms"
    )
    print(f"{'function':22s} {'moment':7s} {'today':>9s} {'now':>9s} {'ratio':>7s}")
    names = {
        "other": "(a) unrelated jit fn",
        "step": "(b) jit train step",
        "cell": "(c) graph train cell",
    }
    for fn in names:
        for moment in MOMENTS:
            today, now = (
                statistics.median(t[fn, moment] for t in timings[arm]) * 1e3
                for arm in ("today", "now")
            )
            print(f"{names[fn]:22s} {moment:7s} {today:9.1f} {now:9.1f} {now / today:7.3f}")


if __name__ == "__main__":
    main()
