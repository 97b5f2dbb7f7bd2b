"""Whether a step accumulates gradients, read from what its train cell holds.

A graph step that calls no optimizer is either a micro-batch of gradient accumulation
(the optimizer runs every M-th step) or an update that the step skipped: a loss-scale
overflow, MindFormers' ``use_skip_data_by_global_norm``, a user's own rule. Call counts
cannot tell the two apart on the step it happens (both clip and do not update), and a
guess learnt from one such step colours every later one. What tells them apart is what
the step keeps between calls: accumulation needs a buffer the gradients are summed into,
and every train cell we know names it so (MindCV's ``GradientAccumulation``
``grad_accumulation.*``, mindone's and MindOCR's ``grad_accumulated_*``, MindFormers'
``accu_grads.*``), or carries its step count (``gradient_accumulation_steps``,
``accum_steps``, ``accumulate_grad``). Read from attributes and Parameter names only:
nothing of the user's is called. (A jit step holds no cell to read: there the counts
still decide, ``gradsource.StepPattern``.)
"""

from __future__ import annotations

import re
from typing import Any

from msmon_nb.collect.hooks import is_optimizer

_BUFFER = re.compile(r"accum|accu_grad|grad_accu", re.IGNORECASE)
_COUNT = re.compile(r"accum", re.IGNORECASE)


def holds_buffer(cell: Any) -> bool | None:
    """True when the train cell holds a gradient accumulation buffer (outside its
    optimizer, whose moments may be named ``accum``: Adagrad's) or a micro-batch count
    above 1; False when it holds neither; None when ``cell`` is no Cell."""
    from mindspore import nn

    if not isinstance(cell, nn.Cell):
        return None
    return _cell_buffer(cell)


def _cell_buffer(cell: Any) -> bool:
    skip: list[str] = []  # prefixes of optimizer cells
    for prefix, sub in cell.cells_and_names():
        if is_optimizer(sub):
            skip.append(prefix)
            continue
        if any(prefix.startswith(s + ".") for s in skip if s):
            continue
        if _counts(sub) or any(_BUFFER.search(p.name) for p in sub.get_parameters(expand=False)):
            return True
    return False


def _counts(cell: Any) -> bool:
    """An attribute that says the cell accumulates over more than one micro-batch."""
    for name, value in vars(cell).items():
        if not _COUNT.search(name) or isinstance(value, float):
            continue
        if value is True or (isinstance(value, int) and not isinstance(value, bool) and value > 1):
            return True
    return False
