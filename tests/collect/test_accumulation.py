"""collect.accumulation: whether a train cell accumulates, read from what it holds."""

from __future__ import annotations

from mindspore import Tensor, nn
from mindspore.nn import TrainOneStepWithLossScaleCell

from msmon_nb.collect.accumulation import holds_buffer
from tests.conformance.harness import TrainCell


def loss_cell():
    net = nn.Dense(3, 2)
    return net, nn.WithLossCell(net, nn.MSELoss())


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
    assert holds_buffer(TrainCell(net, opt, "accumulate"))  # the conformance cell's buffer
    assert not holds_buffer(TrainCell(net, opt, "clip"))


def test_an_optimizer_moment_named_accum_is_no_buffer():
    net, loss = loss_cell()
    adagrad = nn.Adagrad(net.trainable_params())  # its moments: accum.<name>
    assert any("accum" in p.name for p in adagrad.get_parameters())
    assert holds_buffer(TrainOneStepWithLossScaleCell(loss, adagrad, Tensor(1.0))) is False
    assert holds_buffer(object()) is None  # nothing to read
