"""Graph-safe pieces: a global norm usable inside ``mindspore.jit``, and the train-cell tap.

``Model.train`` runs ``TrainOneStepCell``, whose gradients never leave the graph. To
report grad_norm we replace its ``grad_reducer`` (an identity Cell, or the all-reduce in
data parallel) with ``GradNormTap``: it applies the original reducer, then stores the
global norm of the reduced gradients in a non-trainable Parameter that the callback
reads on collected steps. The gradients passed on are unchanged. The norm costs one
fused square-sum per step inside the graph.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

TAP_PARAM = "msmon_grad_norm"


def global_norm(grads: Any) -> Tensor:
    """sqrt(sum ||g||^2) over a tuple of gradients; works in PyNative and inside jit.

    Return it from a jit-compiled train step (``return loss, mm.global_norm(grads)``) and
    ``mon.watch()`` records it as grad_norm.
    """
    squares = [ops.reduce_sum(ops.square(ops.cast(g, ms.float32))) for g in grads]
    return ops.sqrt(ops.addn(squares))


class GradNormTap(nn.Cell):
    """Wraps a train cell's ``grad_reducer`` and keeps the reduced gradients' global norm."""

    def __init__(self, reducer: Any) -> None:
        super().__init__(auto_prefix=False)
        self.reducer = reducer
        self.norm = Parameter(Tensor(0.0, ms.float32), name=TAP_PARAM, requires_grad=False)

    def construct(self, grads):
        grads = self.reducer(grads)
        squares = [ops.reduce_sum(ops.square(ops.cast(g, ms.float32))) for g in grads]
        stored = ops.assign(self.norm, ops.sqrt(ops.addn(squares)))
        return ops.depend(grads, stored)


def install_tap(train_network: Any) -> GradNormTap | None:
    """Put a ``GradNormTap`` into ``train_network``; None when it has no grad_reducer."""
    reducer = getattr(train_network, "grad_reducer", None)
    if reducer is None:
        return None
    if isinstance(reducer, GradNormTap):
        return reducer
    tap = GradNormTap(reducer)
    train_network.grad_reducer = tap
    return tap
