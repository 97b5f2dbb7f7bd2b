"""A tiny real MLP whose gradient explodes in one known parameter from a chosen step.

The failure: a penalty ``coef * ||W_k||^2`` on one layer's weight, switched on at step
``at`` (a mis-set regulariser on one parameter group). Its gradient is
``2 coef W_k`` on ``W_k`` alone, so ``W_k``'s gradient norm rises first and most and the
global grad_norm explodes with it; every other parameter's gradient is untouched at that
step. ``coef`` is a non-trainable Parameter of the user's network: the test (the user)
sets it, never the monitor.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from tests.support import tiny


class Penalised(nn.Cell):
    """``loss(mlp(x), y) + coef * sum(W_k^2)``, W_k the weight of Dense layer ``layer``."""

    def __init__(self, depth: int = 3, hidden: int = 16, layer: int = 1, seed: int = 0) -> None:
        super().__init__()
        ms.set_seed(seed)
        dims = [8] + [hidden] * (depth - 1) + [3]
        cells: list[nn.Cell] = []
        for i in range(depth):
            cells.append(nn.Dense(dims[i], dims[i + 1]))
            if i < depth - 1:
                cells.append(nn.ReLU())
        self.body = nn.SequentialCell(cells)
        self.loss = tiny.loss_fn()
        self.dense = [c for c in cells if isinstance(c, nn.Dense)]
        self.target = self.dense[layer].weight
        self.coef = Parameter(Tensor(0.0, ms.float32), name="coef", requires_grad=False)

    def construct(self, x, y):
        return self.loss(self.body(x), y) + self.coef * ops.reduce_sum(self.target * self.target)

    def switch_on(self, coef: float) -> None:
        """The failure begins (the user's own write to the user's Parameter)."""
        ops.assign(self.coef, Tensor(np.float32(coef)))  # in place: compiled graphs see it


def target_name(net: Penalised) -> str:
    return net.target.name
