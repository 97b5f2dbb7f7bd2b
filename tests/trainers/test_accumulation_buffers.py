"""collect.accumulation on the suites' own train cells (MindCV's TrainStep, mindone's
TrainOneStepWrapper), which only this venv installs (the version job's does not)."""

from __future__ import annotations

from mindspore import Tensor, nn

from msmon_nb.collect.accumulation import holds_buffer
from tests.collect.test_accumulation import loss_cell


def test_the_suites_accumulation_cells_hold_a_buffer():
    from mindcv.utils.train_step import TrainStep
    from mindone.trainers import TrainOneStepWrapper

    net, loss = loss_cell()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    one = Tensor(1.0)
    assert holds_buffer(TrainStep(loss, opt, scale_sense=one, gradient_accumulation_steps=2))
    assert not holds_buffer(TrainStep(loss, opt, scale_sense=one))
    assert holds_buffer(TrainOneStepWrapper(loss, opt, one, gradient_accumulation_steps=2))
    assert not holds_buffer(TrainOneStepWrapper(loss, opt, one))
