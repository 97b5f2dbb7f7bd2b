"""The training process of ``bench/long.py`` part 1: a tiny MLP, monitored or not.

    python bench/long_train.py {on,off,synthetic} STEPS OUT_DIR

A 16-32-4 MLP, batch 16, SGD, its step compiled with ``ms.jit`` (a PyNative step of
this model costs ~15 ms on this machine's CPU, which would make a million steps a day's
work; compiled it is ~2 ms). ``on``: an explicit ``mon.step`` loop with ``log_interval``
1 (loss, grad_norm, lr, throughput, step_time, global_step every step) and the
parameters passed every 100th step, which is how ``param_stats`` is collected every 100th
step while the scalars are collected every step (the config has one interval for all
metrics). ``off``: the same loop, never monitored: the anchor for MindSpore's own growth.

Prints ``SAMPLE step seconds rss_bytes`` about 200 times along the run (flushed, so the
parent sees progress of a run it may stop early) and ``DONE steps seconds`` at the end.
The RSS is ``VmRSS`` of ``/proc/self/status``: read by the process itself at a step
boundary, so every sample is at the same point of the loop.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

PARAM_EVERY = 100
SAMPLES = 200
BATCH = 16


def config(out: Path):
    """Both monitored arms' config: scalars every step, ``param_stats`` where passed."""
    import msmon_nb as mm

    metrics = ["loss", "grad_norm", "learning_rate", "throughput", "step_time"]
    return mm.MonitorConfig(
        save_dir=str(out),
        run_name="long",
        log_interval=1,
        track_metrics=[*metrics, "global_step", "param_stats"],
    )


def rss() -> int:
    """This process's resident set, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build():
    """The jitted train step, its inputs and the network's parameters."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), 0.01)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss, grads

    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.normal(size=(BATCH, 16)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 4, BATCH).astype(np.int32))
    return train_step, x, y, net.trainable_params()


def main() -> None:
    mode, steps, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    train_step, x, y, params = build() if mode != "synthetic" else (None, None, None, None)
    every = max(1, steps // SAMPLES)
    started = time.perf_counter()

    def sample(i: int) -> None:
        print(f"SAMPLE {i} {time.perf_counter() - started:.3f} {rss()}", flush=True)

    done = [0]  # steps completed, for an interrupted run
    try:
        if mode == "synthetic":
            synthetic(out, steps, sample, done)
        elif mode == "off":
            for i in range(steps):
                train_step(x, y)
                done[0] = i + 1
                if i % every == 0:
                    sample(i)
        else:
            monitored(train_step, x, y, params, out, steps, sample, done)
    except KeyboardInterrupt:  # bench/long.py --stop-after: the steps reached are the run
        print(f"STOPPED {done[0]}", flush=True)
    reached = done[0]
    sample(reached)
    print(f"DONE {reached} {time.perf_counter() - started:.3f}", flush=True)


def synthetic(out: Path, steps: int, sample, done: list[int]) -> None:
    """The monitor alone: ``Monitor.step`` with host numbers, the same tags as
    ``monitored`` (grad_norm given, numpy parameters every 100th step), no MindSpore:
    ~10x the steps per second, so its own state is followed through a million steps."""
    import numpy as np

    rng = np.random.default_rng(0)
    params = [rng.normal(size=(32, 16)).astype(np.float32), np.zeros(32, np.float32)]

    def inputs(i: int) -> dict:
        return {"loss": 1.0 / (1 + i * 1e-4), "grad_norm": 0.5 + (i % 10) * 0.01}

    run(out, steps, params, inputs, sample, done)


def monitored(train_step, x, y, params, out: Path, steps: int, sample, done: list[int]) -> None:
    """The loop under a ``Monitor`` (a Ctrl-C closes its run as interrupted)."""

    def inputs(_: int) -> dict:
        loss, grads = train_step(x, y)
        return {"loss": loss, "grads": grads}

    run(out, steps, params, inputs, sample, done)


def run(out: Path, steps: int, params, inputs, sample, done: list[int]) -> None:
    """Both monitored arms' loop: step ``i``'s ``inputs(i)`` (loss and gradients or
    their norm) with the lr, batch size and, every ``PARAM_EVERY`` steps, ``params``;
    the RSS sampled ``SAMPLES`` times."""
    import msmon_nb as mm

    every = max(1, steps // SAMPLES)
    with mm.Monitor(config(out)) as mon:
        for i in range(steps):
            mon.step(
                **inputs(i),
                lr=0.01,
                batch_size=BATCH,
                params=params if i % PARAM_EVERY == 0 else None,
            )
            done[0] = i + 1
            if i % every == 0:
                sample(i)


if __name__ == "__main__":
    main()
