"""What a monitored third-party trainer is checked against: an unmonitored twin run.

The twin trains the same model on the same batches with the suite's own train step and,
before each update, takes the gradient of the loss with respect to the trainable
parameters itself (``value_and_grad`` of the loss cell: no loss scale, no clipping, no
accumulation), in float64. That is ``train/grad_norm`` as DESIGN.md defines it. The
twin's trainable weights are what the monitored run's must match bit for bit (the
reference pass moves only BatchNorm's running statistics, never a trainable weight).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np


def float64_norm(grads: Sequence[Any]) -> float:
    """sqrt(sum ||g||^2) in float64 on the host."""
    total = 0.0
    for g in grads:
        arr = g.astype(ms.float32).asnumpy() if g.dtype == ms.bfloat16 else g.asnumpy()
        arr = arr.astype(np.float64)
        total += float((arr * arr).sum())
    return math.sqrt(total)


def loss_gradient_norm(loss_cell: Any, params: Sequence[Any], *batch: Any) -> tuple[float, float]:
    """(loss, norm of d loss / d params) for one batch, as the model produces them."""

    def forward(*args):
        return loss_cell(*args)

    loss, grads = ms.value_and_grad(forward, None, list(params))(*batch)
    return float(loss.astype(ms.float32).asnumpy()), float64_norm(grads)


class Reference(ms.train.Callback):
    """Before every ``Model.train`` step: the reference loss and norm of that step's
    batch (``batches[i]`` for the i-th step), with the weights as they are then."""

    def __init__(self, loss_cell: Any, params: Sequence[Any], batches: Sequence[tuple]) -> None:
        super().__init__()
        self.loss_cell, self.params, self.batches = loss_cell, list(params), batches
        self.losses: list[float] = []
        self.norms: list[float] = []
        self.grads: list[list[np.ndarray]] = []  # float64, for accumulated gradients

        def forward(*args):
            return loss_cell(*args)

        # one function, so GRAPH_MODE compiles it once
        self.grad_fn = ms.value_and_grad(forward, None, self.params)

    def on_train_step_begin(self, run_context: Any) -> None:
        batch = self.batches[len(self.norms)]
        loss, grads = self.grad_fn(*batch)
        self.losses.append(float(loss.astype(ms.float32).asnumpy()))
        self.norms.append(float64_norm(grads))
        self.grads.append([g.asnumpy().astype(np.float64) for g in grads])

    def accumulated_norm(self, first: int, count: int) -> float:
        """Norm of the mean gradient of steps ``first`` .. ``first + count - 1`` (0-based)."""
        total = 0.0
        for parts in zip(*self.grads[first : first + count], strict=True):
            mean = sum(parts) / count
            total += float((mean * mean).sum())
        return math.sqrt(total)


def weights(params: Sequence[Any]) -> list[np.ndarray]:
    return [p.asnumpy().copy() for p in params]


def assert_same_weights(a: Sequence[Any], b: Sequence[Any]) -> None:
    """Bit-identical parameters (monitoring never changes training)."""
    assert len(a) == len(b)
    for x, y in zip(weights(a), weights(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x, y), "monitoring changed the trained weights"
