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


def _optimizer_classes() -> list[type]:
    """``nn.Optimizer`` and every subclass defined so far that has its own ``construct``."""
    out, stack = [], [nn.Optimizer]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "construct" in vars(cls):
            out.append(cls)
    return out


class OptimizerTap:
    """Records the global norm of the gradients every optimizer receives, and its lr,
    also inside compiled graphs (a ``@ms.jit`` step holding the optimizer call).

    ``install()`` replaces ``construct`` on each optimizer class (so optimizers created
    earlier see it) with a wrapper that assigns ``sqrt(sum ||g||^2)``, ``get_lr()`` and a
    call counter to three non-trainable Parameters, then runs the original update on the
    same gradients. MindSpore compiles the wrapper into any graph that calls the
    optimizer. Functions compiled before keep their graphs: ``install`` removes their
    phases from the compile cache so that their next call compiles again, and
    ``uninstall`` does the same so that nothing of ours stays in the user's graphs.
    ``read()`` copies three scalars to the host.
    """

    def __init__(self, cache: set | None) -> None:
        self.cache = cache
        self.norm = _scalar("msmon_tap_grad_norm", 0.0, ms.float32)
        self.lr = _scalar("msmon_tap_lr", 0.0, ms.float32)
        self.count = _scalar("msmon_tap_count", 0, ms.int32)
        self._saved: list[tuple[type, Any]] = []
        # read by the wrapper: constant (False) where a graph compiles it; True while a
        # PyNative optimizer call runs it in Python, where the watch already sees the
        # gradients and the lr, and the norm would cost one op launch per gradient
        self.mode = TapMode()

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self) -> None:
        for cls in _optimizer_classes():
            original = vars(cls)["construct"]
            if _takes_gradients_only(original):
                self._saved.append((cls, original))
                cls.construct = _tapped(original, self.norm, self.lr, self.count, self.mode)
        self._recompile()

    def uninstall(self) -> None:
        if not self._saved:
            return
        for cls, original in reversed(self._saved):
            cls.construct = original
        self._saved.clear()
        self._recompile()

    def _recompile(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def read_count(self) -> int:
        return int(self.count.asnumpy())

    def read(self) -> tuple[int, float, float]:
        """(calls so far, the last call's gradient norm, the last call's lr)."""
        return self.read_count(), float(self.norm.asnumpy()), float(self.lr.asnumpy())


def _scalar(name: str, value: Any, dtype: Any) -> Parameter:
    return Parameter(Tensor(value, dtype), name=name, requires_grad=False)


def _takes_gradients_only(construct: Any) -> bool:
    import inspect

    try:
        params = list(inspect.signature(construct).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 2 and all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)


class TapMode:
    """Whether the tap wrapper runs in Python (PyNative optimizer call): then it skips."""

    python = False


def _tapped(
    original: Any, norm: Parameter, lr_store: Parameter, count: Parameter, mode: TapMode
) -> Any:
    # MindSpore parses this function's source when it compiles a graph that calls the
    # optimizer: it must stay plain graph syntax (closure variables, no try/with).
    def construct(self, gradients):
        if mode.python:
            return original(self, gradients)
        lr = self.get_lr()
        if self.is_group_lr:
            lr = lr[0]
        squares = [ops.reduce_sum(ops.square(ops.cast(g, ms.float32))) for g in gradients]
        stored = ops.assign(norm, ops.sqrt(ops.addn(squares)))
        stored = ops.depend(stored, ops.assign(lr_store, ops.cast(lr, ms.float32)))
        stored = ops.depend(stored, ops.assign_add(count, ops.ones((), ms.int32)))
        return original(self, ops.depend(gradients, stored))

    return construct
