"""grad_norm where the gradients live: one fused reduction on the device, one scalar to
the host, read one step late so that reading it never stalls the step.

On Ascend/GPU the host path would copy every gradient over the bus on each collected
step (O(parameters) bytes, ~160 ms for 1 B float32 parameters at PCIe speed). Here the
global norm is one ``mindspore.jit`` function over the whole gradient tuple: the tuple
is passed as ``mutable`` so that MindSpore compiles it once per gradient structure
(shapes and dtypes) instead of once per call -- without ``mutable`` it treats the tuple
as a constant and recompiles at every step (seen on 2.10 and 2.7.1: the compile cache
grows by one phase per call). One graph launch, one 4-byte result.

The launch returns at once on an accelerator (MindSpore queues device work), so the
value is not read at the collected step ``s`` itself: ``DeferredNorm.put`` keeps the
unread result, and the Monitor reads it at its next step record (when step ``s + 1`` --
or a later step -- has been dispatched, so the queue has moved past the reduction) and
records it *at step* ``s``. Its chart point therefore appears one step late, at its
own step; the run's last pending value is read when the monitor closes.

On CPU MindSpore's kernels reduce 10-30x slower than numpy's BLAS dot on the shared
memory ``asnumpy`` returns (``bench/scale.py`` prints both), so there the host path
stays the default and this one runs only when forced (``MSMON_GRAD_NORM_PATH=device``,
how the tests exercise it). MindSpore is imported only when a norm is launched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msmon_nb.collect.tensors import to_float

_compiled: Any = None  # the jit function, built at first use (MindSpore imported lazily)


def _norm_function() -> Any:
    """``sqrt(sum_i sum(g_i**2))`` as one ``mindspore.jit`` graph over ``*grads``."""
    global _compiled
    if _compiled is None:
        import mindspore as ms

        from msmon_nb.collect.graph import square_sum

        def msmon_global_norm(grads):
            return ms.ops.sqrt(ms.ops.addn([square_sum(g) for g in grads]))

        _compiled = ms.jit(msmon_global_norm)
    return _compiled


def launch_global_norm(leaves: Sequence[Any]) -> Any:
    """Queue the global norm of ``leaves`` (MindSpore tensors) as one graph launch and
    return its unread 0-d float32 tensor; nothing is copied to the host here."""
    import mindspore as ms

    return _norm_function()(ms.mutable(tuple(leaves)))


class DeferredNorm:
    """At most one launched, unread norm and the step it belongs to."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: tuple[int, Any] | None = None

    def put(self, step: int, value: Any) -> tuple[int, float] | None:
        """Hold ``value`` (unread) for ``step``; a value still pending is read and
        returned first, so none is ever dropped."""
        earlier = self.take() if self.pending is not None else None
        self.pending = (step, value)
        return earlier

    def take(self) -> tuple[int, float] | None:
        """``(step, norm)`` of the pending value (one 4-byte copy), or None."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        step, value = pending
        number = to_float(value)
        return None if number is None else (step, number)
