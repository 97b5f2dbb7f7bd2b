"""A train cell that accumulates with ``ops.assign_add`` in its own ``construct``: each
micro-batch's gradient norm, tapped inside its graph while it compiles for the taps.

MindOCR 0.5.0's ``TrainOneStepWrapper`` adds each call's gradients into its buffers with
``self.map(self.partial(ops.assign_add), self.accumulated_grads, grads)`` -- not with
MindSpore's accumulation op, which ``collect.gradtaps`` re-registers for MindCV and
mindone -- and moves its step counter with the same ``ops.assign_add``. Wrapping
``mindspore.ops.assign_add`` itself would wrap every graph's (ours included), and the
cell's graph is parsed from its module's globals. So ``swapped`` gives the cell's module
a view of ``mindspore.ops`` (every attribute the same object, ``assign_add`` ours) only
for the one compile the taps make of that cell (``collect.recompile``'s keyed compile
under a watch, the callback's compile before ``Model.train``), and puts the module's
own ``ops`` back after it: nothing else ever sees the view.

The wrapper (``GraphTaps.assign_add``) counts each floating gradient and, on collected
steps, adds its squares to the micro-batch sum; the counter (an integer) passes
untouched, and the values reach ``assign_add`` unchanged (``ops.depend``). MindOCR
divides each call's gradients by ``scale x N`` before adding (``down_scale_grads``): the
scale is then undone, and the factor ``N`` (its ``grad_accu_steps``) is put back so the
norm is the micro-batch's own. Only a cell of that shape is changed (``target``): a
class defining ``down_scale_grads``, an integer ``grad_accu_steps`` above 1, a
``construct`` that names ``assign_add`` through a module global bound to
``mindspore.ops``.

MindSpore resolves a module by its ``__name__`` (``ModuleNamespace`` imports it), so
the view is registered in ``sys.modules`` under a name of its own while it is in place.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


def target(cell: Any) -> tuple[types.ModuleType, str, float] | None:
    """``(the module, the name its code uses for mindspore.ops, N)`` for a train cell
    of MindOCR's shape (see the module docstring); None for every other."""
    import mindspore

    steps = getattr(cell, "grad_accu_steps", None)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 1:
        return None
    for cls in type(cell).__mro__:
        own = vars(cls)
        construct = own.get("construct")
        if "down_scale_grads" not in own or not isinstance(construct, types.FunctionType):
            continue
        names = construct.__code__.co_names
        if "assign_add" not in names:
            return None
        module = sys.modules.get(cls.__module__)
        found = vars(module) if module is not None else {}
        for name in names:
            if found.get(name) is mindspore.ops:
                return module, name, float(steps)
        return None
    return None


@contextmanager
def swapped(cell: Any, wrap: Callable[[Any, float], Any]) -> Iterator[bool]:
    """While the block runs (one compile of ``cell``), the cell's module sees a view of
    ``mindspore.ops`` whose ``assign_add`` is ``wrap(original, N)``; True when it was
    swapped. Put back whatever happens in the block."""
    found = target(cell)
    if found is None:
        yield False
        return
    module, name, factor = found
    ops = getattr(module, name)
    view = types.ModuleType(f"_msmon_ops_view_{id(module):x}")
    view.__dict__.update(vars(ops))
    # (the copy brought ops' own __name__, by which MindSpore would find ops again)
    view.__name__ = f"_msmon_ops_view_{id(module):x}"
    view.__spec__ = None
    view.assign_add = wrap(ops.assign_add, factor)
    sys.modules[view.__name__] = view
    setattr(module, name, view)
    try:
        yield True
    finally:
        setattr(module, name, ops)
        sys.modules.pop(view.__name__, None)
