"""``msmon demo``: a small MindSpore model trained on generated data, monitored.

No downloads: the data are Gaussian blobs drawn from a fixed seed, so the run is the same
on every machine. The learning rate warms up then decays (a dynamic schedule), so every
core curve has something to show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msmon_nb.monitor import Monitor


@dataclass
class DemoData:
    """Inputs and labels of the demo task."""

    x: np.ndarray
    y: np.ndarray


def make_data(n: int = 4096, features: int = 32, classes: int = 10, seed: int = 0) -> DemoData:
    """Gaussian blobs: ``classes`` centres in ``features`` dimensions, unit noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.4, size=(classes, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = centres[y] + rng.normal(size=(n, features)).astype(np.float32)
    return DemoData(x, y)


def lr_schedule(steps: int, peak: float = 0.05, warmup: int | None = None) -> list[float]:
    """Linear warmup to ``peak`` then cosine decay to 1 % of it."""
    warmup = warmup if warmup is not None else max(1, steps // 10)
    out = []
    for s in range(steps):
        if s < warmup:
            out.append(peak * (s + 1) / warmup)
        else:
            t = (s - warmup) / max(1, steps - warmup)
            out.append(peak * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t))))
    return out


def build(features: int = 32, hidden: int = 64, classes: int = 10, steps: int = 300):
    """(network, loss_fn, optimizer) of the demo MLP, with its dynamic learning rate."""
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(features, hidden), nn.ReLU(), nn.Dense(hidden, classes)])
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr_schedule(steps), momentum=0.9)
    return net, loss_fn, opt


def batches(data: DemoData, batch_size: int, steps: int, seed: int = 1):
    """``steps`` random mini-batches as MindSpore tensors."""
    import mindspore as ms

    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.integers(0, len(data.y), size=batch_size)
        yield ms.Tensor(data.x[idx]), ms.Tensor(data.y[idx])


def train(
    save_dir: str | Path,
    steps: int = 300,
    batch_size: int = 64,
    log_interval: int = 1,
    progress: bool = False,
):
    """Train the demo model under ``Monitor.watch()``; returns the finished ``Monitor``.

    The loop below is an ordinary MindSpore loop: the monitor observes it unchanged.
    """
    import mindspore as ms

    data = make_data()
    net, loss_fn, opt = build(steps=steps)

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    mon = Monitor(save_dir=str(save_dir), model_name="demo", log_interval=log_interval)
    if progress:
        mon.add_boundary_hook(_progress_bar(steps))
    with mon, mon.watch():
        for x, y in batches(data, batch_size, steps):
            _loss, grads = grad_fn(x, y)
            opt(grads)
    return mon


def _progress_bar(total: int):
    """A terminal progress bar showing the latest loss and grad_norm (a boundary hook)."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="step", desc="demo", dynamic_ncols=True, mininterval=0.25)

    def hook(mon) -> None:
        bar.n = mon.step_count
        loss, norm = mon.series.get("train/loss"), mon.series.get("train/grad_norm")
        if loss is not None and norm is not None and len(loss):
            bar.set_postfix(
                loss=f"{loss.last():.4f}", grad_norm=f"{norm.last():.3g}", refresh=False
            )
        bar.update(0)
        if mon.step_count >= total:
            bar.close()

    return hook
