"""The tap on MindSpore's gradient accumulation op (``mindspore.boost.grad_accumulation``,
which MindCV's and mindone's train steps import by name): replaced in place while
installed, the original again after, in what MindSpore compiles too. (The suites' own
cells, monitored against float64 twins: tests/trainers/test_suite_cells.py and
tests/trainers/test_mindcv.py.)"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.boost.grad_accumulation import gradient_accumulation_op as accumulate

from msmon_nb.collect.gradtaps import ACCUMULATE, GraphTaps, overloaded


class Accumulating(nn.Cell):
    """Adds a gradient-shaped input into a buffer as MindCV's cell does (the op divides
    it by the accumulation steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = Parameter(Tensor(np.zeros(4, np.float32)), name="buffer")
        self.map = ops.HyperMap()

    def construct(self, grad):
        return self.map(ops.partial(accumulate, 2), (self.buffer,), (grad,))


def test_the_op_is_wrapped_while_installed_and_the_original_after():
    original, entries = overloaded(accumulate, ACCUMULATE), list(accumulate.entries)
    taps = GraphTaps(cache=None)
    taps.install(recompile=False)
    try:
        assert overloaded(accumulate, ACCUMULATE) is not original
        taps.set_collect(True)
        ms.set_context(mode=ms.GRAPH_MODE)
        cell = Accumulating()
        cell(Tensor(np.array([3.0, 4.0, 0.0, 0.0], np.float32)))
        assert taps.counts()[3] == 1
        assert taps.micro_norm() == 5.0  # the gradient before the op halves it
        np.testing.assert_array_equal(cell.buffer.asnumpy(), [1.5, 2.0, 0.0, 0.0])
    finally:
        taps.uninstall(recompile=False)
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert overloaded(accumulate, ACCUMULATE) is original
    assert accumulate.entries == entries
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        after = Accumulating()  # compiled after: MindSpore's own function again
        after(Tensor(np.ones(4, np.float32)))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert taps.counts()[3] == 1  # no call of ours since
    np.testing.assert_array_equal(after.buffer.asnumpy(), [0.5] * 4)
