"""collect.accumulation: whether a train cell accumulates, read from what it holds.
(The suites' own cells: tests/trainers/test_accumulation_buffers.py.)"""

from __future__ import annotations

from mindspore import Tensor, nn
from mindspore.nn import TrainOneStepWithLossScaleCell

from msmon_nb.collect.accumulation import holds_buffer
from tests.conformance.harness import TrainCell


def loss_cell():
    net = nn.Dense(3, 2)
    return net, nn.WithLossCell(net, nn.MSELoss())


def test_an_optimizer_moment_named_accum_is_no_buffer():
    net, loss = loss_cell()
    adagrad = nn.Adagrad(net.trainable_params())  # its moments: accum.<name>
    assert any("accum" in p.name for p in adagrad.get_parameters())
    assert holds_buffer(TrainOneStepWithLossScaleCell(loss, adagrad, Tensor(1.0))) is False
    assert holds_buffer(object()) is None  # nothing to read


def test_the_conformance_cell_holds_a_buffer_when_it_accumulates():
    net, _ = loss_cell()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    assert holds_buffer(TrainCell(net, opt, "accumulate"))
    assert not holds_buffer(TrainCell(net, opt, "clip"))
