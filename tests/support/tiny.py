"""Tiny real MindSpore models and data for tests (CPU, a few ms a step)."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn


def data(n: int = 512, features: int = 8, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=1.0, size=(classes, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    x = centres[y] + rng.normal(size=(n, features)).astype(np.float32)
    return x, y


def mlp(features: int = 8, hidden: int = 16, classes: int = 3, seed: int = 0) -> nn.Cell:
    ms.set_seed(seed)
    return nn.SequentialCell([nn.Dense(features, hidden), nn.ReLU(), nn.Dense(hidden, classes)])


def loss_fn():
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def batches(x, y, batch: int = 32, steps: int = 20, seed: int = 1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.integers(0, len(y), size=batch)
        yield ms.Tensor(x[idx]), ms.Tensor(y[idx])


def numpy_global_norm(grads) -> float:
    """The reference: sqrt(sum ||g||^2) in float64 numpy."""
    return math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))


def warmup_lr(steps: int, peak: float = 0.1, warmup: int = 5) -> list[float]:
    return [peak * min(1.0, (s + 1) / warmup) for s in range(steps)]
