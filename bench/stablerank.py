"""Cost of ``stable_rank`` on an Adam-trained MLP (CPU, PyNative, watched loop).

The 10 M-parameter MLP of ``bench/scale.py`` (``--size``): 1024x2048, two 2048x2048 and a
10x2048 weight. Two arms in one process, alternating blocks of ``--steps`` steps, each block's mean
step time:

* ``off``: ``mon.watch()`` with ``log_interval: 1`` and the core metrics;
* ``on``: the same with ``stable_rank`` read every 10th collected step (ten times as
  often as the default, so that every block holds reads).

Printed: each arm's mean step, the on/off ratio per round (median and spread), one due
read alone (``StableRanks.read`` on the trained weights, warm-started as a run keeps it:
ms, matrix-vector products, ns per weight element; and from a cold start), and what that
read predicts: +read/(10 x step) for the ``on`` arm, +read/(100 x step) at the default
``stable_rank_every: 100``.

    GLOG_v=3 .venv/bin/python bench/stablerank.py [--size 10M] [--rounds 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
from mindspore import nn

# run as a script: bench/ is on sys.path, so the MLP sizes are the scale bench's own
from scale import SIZES, mlp

from msmon_nb.collect.stablerank import StableRanks
from msmon_nb.config import CORE_METRICS
from msmon_nb.monitor import Monitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="10M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    features, hidden, blocks = SIZES[args.size]
    ms.set_seed(0)
    net = mlp(features, hidden, blocks)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-4)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x = ms.ops.randn(16, features)
    y = ms.Tensor([i % 10 for i in range(16)], ms.int32)
    matrices = [p for p in opt.parameters if p.ndim == 2]
    elements = sum(p.size for p in matrices)
    print(f"MLP {args.size}: {len(matrices)} weight matrices, {elements / 1e6:.1f} M elements")

    def block(track: list[str], base: str) -> float:
        times = []
        cfg = dict(log_interval=1, track_metrics=track, stable_rank_every=10)
        cfg["alerts"] = {"disabled": ["grad_vanishing"]}  # a 1e-4 lr: quiet, not vanishing
        with Monitor(save_dir=base, **cfg) as mon, mon.watch():
            for _ in range(args.steps):
                t0 = time.perf_counter()
                _, grads = grad_fn(x, y)
                opt(grads)
                times.append(time.perf_counter() - t0)
        return statistics.mean(times[1:])  # the mean: the reads are a few steps' outliers

    arms = {"off": list(CORE_METRICS), "on": [*CORE_METRICS, "stable_rank"]}
    medians: dict[str, list[float]] = {a: [] for a in arms}
    ratios = []
    with tempfile.TemporaryDirectory() as base:
        block(arms["off"], base)  # warm-up: compile, caches
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            got = {arm: block(arms[arm], base) for arm in order}
            for arm, secs in got.items():
                medians[arm].append(secs)
            ratios.append(got["on"] / got["off"])
    for arm in arms:
        print(f"  {arm:>3}: mean step {statistics.median(medians[arm]) * 1e3:8.2f} ms")
    print(
        f"  on/off per round: median {statistics.median(ratios):.3f}x "
        f"(spread {min(ratios):.3f}-{max(ratios):.3f}, {args.rounds} rounds of "
        f"{args.steps} steps, every 10th collected step reads)"
    )
    warm = StableRanks([".*"], 1, lambda key, message: None)
    warm.read(matrices)  # the vectors a run would hold
    for _ in range(3):  # the weights move a little between reads, as in training
        _, grads = grad_fn(x, y)
        opt(grads)
    step = statistics.median(medians["off"])
    reads = {}
    for label, ranks in (("warm", warm), ("cold", StableRanks([".*"], 1, lambda k, m: None))):
        before = ranks.products
        t0 = time.perf_counter()
        ranks.read(matrices)
        secs = reads[label] = time.perf_counter() - t0
        products = ranks.products - before
        print(
            f"  one read, {label}: {secs * 1e3:7.1f} ms = {secs / step:.2f} plain steps, "
            f"{products} products over {len(matrices)} matrices, "
            f"{secs * 1e9 / elements:.1f} ns/element"
        )
    print(
        f"  predicted by the warm read: on/off {1 + reads['warm'] / (10 * step):.3f}x; at the "
        f"default stable_rank_every 100 (log_interval 1): +{reads['warm'] / (100 * step):.1%} "
        "of a step, every weight of the model selected"
    )


if __name__ == "__main__":
    main()
