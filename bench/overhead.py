"""Monitoring overhead, plain vs monitored, in one process, blocks alternating.

Model: MLP 784-512-512-10, batch 64, CPU, Momentum.

1. Functional PyNative loop (``value_and_grad`` + optimizer) unchanged under
   ``mon.watch()``, collecting loss, grad_norm and lr every step and every 10th step.
   Targets: <= 1.03 and <= 1.01.
2. ``Model.train`` in graph mode: plain, with our callback every step (grad_norm
   included; target <= 1.05), and with MindSpore's ``SummaryCollector(collect_freq=1)``.

    python bench/overhead.py [--steps 20] [--rounds 30] [--train-steps 300]

Prints ratios of median block times (blocks interleaved, order rotated each round) and,
for the functional loop, the time spent inside the monitor itself per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import nn
from mindspore.train import Model, SummaryCollector

from msmon_nb.monitor import Monitor


def mlp() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(
        [nn.Dense(784, 512), nn.ReLU(), nn.Dense(512, 512), nn.ReLU(), nn.Dense(512, 10)]
    )


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def functional(steps: int, rounds: int, base: str) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = mlp()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    x, y = data(64 * 8)
    batches = [(ms.Tensor(x[i : i + 64]), ms.Tensor(y[i : i + 64])) for i in range(0, 512, 64)]

    def block() -> float:
        t0 = time.perf_counter()
        for i in range(steps):
            loss, grads = grad_fn(*batches[i % len(batches)])
            opt(grads)
        float(loss.asnumpy())  # wait for the queued work, as a user printing the loss would
        return time.perf_counter() - t0

    block()  # warm up
    every = Monitor(save_dir=base, run_name="every_step", log_interval=1)
    tenth = Monitor(save_dir=base, run_name="every_10th", log_interval=10)
    spent = {id(every): 0.0, id(tenth): 0.0}
    for mon in (every, tenth):  # time spent inside the monitor itself, attributed directly
        inner = mon._record_step
        key = id(mon)

        def timed(*a, _inner=inner, _key=key, **k):
            t0 = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                spent[_key] += time.perf_counter() - t0

        mon._record_step = timed
    variants = {"plain": None, "every step": every, "every 10th step": tenth}
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for r in range(rounds):
        for name in order[r % 3 :] + order[: r % 3]:  # rotate so no variant always runs first
            mon = variants[name]
            if mon is None:
                times[name].append(block())
            else:
                with mon.watch():
                    times[name].append(block())
    every.close()
    tenth.close()
    plain = statistics.median(times["plain"])
    print(f"functional loop (PyNative), {steps}-step blocks x {rounds} rounds, order rotated:")
    print(f"  plain: {plain / steps * 1e3:.1f} ms/step ({steps / plain:.0f} steps/s)")
    for name, mon in (("every step", every), ("every 10th step", tenth)):
        target = 1.03 if name == "every step" else 1.01
        ratio = statistics.median(times[name]) / plain
        q1, _, q3 = statistics.quantiles([t / plain for t in times[name]], n=4)
        inside = spent[id(mon)] / (rounds * steps)
        print(
            f"  monitored/plain, {name:16s}: {ratio:.3f} [IQR {q1:.2f}-{q3:.2f}] "
            f"(target <= {target}); inside the monitor {inside * 1e6:.0f} us/step "
            f"= {inside / (plain / steps):.2%} of a step"
        )
    q1, _, q3 = statistics.quantiles([t / plain for t in times["plain"]], n=4)
    print(f"  (plain blocks themselves vary: IQR {q1:.2f}-{q3:.2f} of their median)")


def model_train(train_steps: int, rounds: int, base: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = data(64 * train_steps, seed=1)
    dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64)
    net = mlp()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss_fn=loss_fn, optimizer=opt)
    mon = Monitor(save_dir=base, run_name="model_train", log_interval=1)
    callback = mon.callback()

    def block(callbacks) -> float:
        t0 = time.perf_counter()
        model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
        return time.perf_counter() - t0

    block([callback])  # compile once with the tap in place
    block(None)
    ours, theirs, plain_times = [], [], []
    for r in range(rounds):
        plain = block(None)
        ours.append(block([callback]) / plain)
        plain_times.append(plain)
        collector = SummaryCollector(str(Path(base) / f"collector_{r}"), collect_freq=1)
        plain = block(None)
        theirs.append(block([collector]) / plain)
        plain_times.append(plain)
    mon.close()
    per_step = statistics.median(plain_times) / train_steps
    print(f"Model.train (graph mode), {train_steps}-step epochs, {rounds} rounds:")
    print(f"  plain: {per_step * 1e3:.2f} ms/step ({1 / per_step:.0f} steps/s)")
    print(
        f"  msmon_nb callback / plain, every step : {statistics.median(ours):.3f}  (target <= 1.05)"
    )
    print(f"  SummaryCollector(collect_freq=1) / plain: {statistics.median(theirs):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--train-rounds", type=int, default=5)
    parser.add_argument("--only", choices=("functional", "model"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        if args.only in (None, "functional"):
            functional(args.steps, args.rounds, base)
        if args.only in (None, "model"):
            model_train(args.train_steps, args.train_rounds, base)


if __name__ == "__main__":
    main()
