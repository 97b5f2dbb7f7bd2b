"""Monitoring overhead, plain vs monitored, in one process, blocks alternating.

Model: MLP 784-512-512-10, batch 64, CPU, Momentum.

1. Functional PyNative loop (``value_and_grad`` + optimizer) unchanged under
   ``mon.watch()``, collecting loss, grad_norm and lr every step and every 10th step.
   Targets: <= 1.03 and <= 1.01.
2. ``Model.train`` in graph mode: plain (a model msmon never touched), with our callback
   collecting every step (grad_norm included; target <= 1.05) and every 10th step, and
   with MindSpore's ``SummaryCollector(collect_freq=1)``; also the callback's own time
   per step and the CPU time per step, which other processes on the machine do not move.

    python bench/overhead.py [--steps 20] [--rounds 30] [--train-steps 300] [--only model]
                             [--lr-schedule]

Prints ratios of block times (blocks interleaved, order rotated each round) with their
spread, and the time spent inside the monitor itself per step.
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


class _Own:
    """The callback's own time around its per-step methods, summed: wall (perf_counter)
    and this thread's CPU time (thread_time), which time given to other processes on a
    shared machine does not inflate."""

    def __init__(self, callback) -> None:
        self.secs = 0.0
        self.cpu = 0.0
        self.steps = 0
        for name in ("on_train_step_begin", "on_train_step_end"):
            inner = getattr(callback, name)
            end = name.endswith("end")

            def timed(run_context, _inner=inner, _end=end):
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return _inner(run_context)
                finally:
                    self.secs += time.perf_counter() - t0
                    self.cpu += time.thread_time() - c0
                    self.steps += _end

            setattr(callback, name, timed)


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} [IQR {q1:.3f}-{q3:.3f}, min {min(values):.3f}]"


def model_train(train_steps: int, rounds: int, base: str, schedule: bool = False) -> None:
    """Blocks of one epoch each, alternating within every round (order rotated).

    Plain runs on a Model of its own that msmon never touched: the grad_norm tap changes
    the monitored model's graph for good, so timing plain on that model (as this bench
    did before) hid the tap's cost. Both models are built alike from the same seed.
    Besides wall-time ratios (noisy on a shared machine) it prints what does not depend
    on other processes: the callback's own time per step (perf_counter inside it) and
    this process's CPU time per step (all MindSpore threads included).
    """
    ms.set_context(mode=ms.GRAPH_MODE)
    x, y = data(64 * train_steps, seed=1)

    def model() -> tuple[Model, mds.Dataset]:
        net = mlp()
        # --lr-schedule: a list schedule (warmup), as nn.warmup_lr/cosine_decay_lr give,
        # long enough for every round; its lr is read on each collected step
        n = train_steps * (2 * rounds + 5)  # the monitored model runs two variants
        lr = [0.01 * min(1.0, (i + 1) / 100) for i in range(n)] if schedule else 0.01
        opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(64)
        return Model(net, loss_fn=loss_fn, optimizer=opt), dataset

    every = Monitor(save_dir=base, run_name="model_train_every", log_interval=1)
    tenth = Monitor(save_dir=base, run_name="model_train_tenth", log_interval=10)
    cb_every, cb_tenth = every.callback(), tenth.callback()
    own = {"every step": _Own(cb_every), "every 10th": _Own(cb_tenth)}
    plain_model, plain_data = model()
    mon_model, mon_data = model()
    sc_model, sc_data = model()
    variants = {
        "plain": (plain_model, plain_data, lambda r: None),
        "every step": (mon_model, mon_data, lambda r: [cb_every]),
        "every 10th": (mon_model, mon_data, lambda r: [cb_tenth]),
        "SummaryCollector": (
            sc_model,
            sc_data,
            lambda r: [SummaryCollector(str(Path(base) / f"collector_{r}"), collect_freq=1)],
        ),
    }

    def block(name: str, r: int) -> tuple[float, float]:
        m, dataset, callbacks = variants[name]
        t0, c0 = time.perf_counter(), time.process_time()
        m.train(1, dataset, callbacks=callbacks(r), dataset_sink_mode=False)
        return (time.perf_counter() - t0) / train_steps, (time.process_time() - c0) / train_steps

    for name in variants:  # compile each graph (the tapped one included) before timing
        block(name, -1)
    for o in own.values():
        o.secs, o.cpu, o.steps = 0.0, 0.0, 0
    wall: dict[str, list[float]] = {n: [] for n in variants}
    cpu: dict[str, list[float]] = {n: [] for n in variants}
    order = list(variants)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            w, c = block(name, r)
            wall[name].append(w)
            cpu[name].append(c)
    every.close()
    tenth.close()
    plain_w, plain_c = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
    print(
        f"Model.train (graph mode, dataset_sink_mode=False), {train_steps}-step epochs x "
        f"{rounds} rounds, blocks alternating:"
    )
    print(f"  plain: {plain_w * 1e3:.2f} ms/step wall, {plain_c * 1e3:.2f} ms/step CPU")
    print(f"  plain blocks / their median (wall): {_spread([w / plain_w for w in wall['plain']])}")
    for name in ("every step", "every 10th", "SummaryCollector"):
        ratios = [w / p for w, p in zip(wall[name], wall["plain"], strict=True)]
        cpu_ratio = statistics.median(cpu[name]) / plain_c
        line = f"  {name:16s} / plain, wall (per round): {_spread(ratios)}; CPU: {cpu_ratio:.3f}"
        if name in own:
            steps = max(own[name].steps, 1)
            per_step, per_cpu = own[name].secs / steps, own[name].cpu / steps
            line += (
                f"; callback own {per_step * 1e6:.0f} us/step wall, {per_cpu * 1e6:.0f} us "
                f"CPU = {per_cpu / plain_w:.2%} of a plain step"
            )
        if name == "every step":
            line += "  (target <= 1.05)"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument(
        "--train-rounds", type=int, default=None, help="Model.train rounds (default: --rounds)"
    )
    parser.add_argument("--only", choices=("functional", "model"), default=None)
    parser.add_argument(
        "--lr-schedule", action="store_true", help="Model.train with a list lr schedule"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        if args.only in (None, "functional"):
            functional(args.steps, args.rounds, base)
        if args.only in (None, "model"):
            model_train(args.train_steps, args.train_rounds or args.rounds, base, args.lr_schedule)


if __name__ == "__main__":
    main()
