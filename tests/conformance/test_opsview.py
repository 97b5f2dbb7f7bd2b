"""``collect.opsview``: which train cell's module gets a view of ``mindspore.ops`` while it
compiles for the taps, and that the module's own ``ops`` is back afterwards, whatever
happened. (That the view's ``assign_add`` measures each micro-batch exactly and leaves
training bit-identical: ``tests/trainers/test_suite_cells.py -k "mindocr and
accumulate"``.)"""

from __future__ import annotations

import sys

import mindspore as ms
import pytest
from mindspore import Tensor, nn

from msmon_nb.collect.opsview import swapped, target
from tests.conformance import harness as h
from tests.conformance.optimizers import BUILD
from tests.conformance.suites import load_mindocr


def mindocr_cell(steps: int) -> nn.Cell:
    wrapper = load_mindocr("utils.train_step_wrapper").TrainOneStepWrapper
    net = h.network()
    opt = BUILD["mindcv:adamw"].build(net.trainable_params(), 0.01, loss_scale=1.0)
    network = nn.WithLossCell(net, h.loss_function())
    return wrapper(network, opt, scale_sense=Tensor(1024.0), gradient_accumulation_steps=steps)


def test_only_mindocrs_accumulating_cell_is_a_target():
    module = load_mindocr("utils.train_step_wrapper")
    assert target(mindocr_cell(2)) == (module, "ops", 2.0)
    assert target(mindocr_cell(1)) is None  # nothing accumulated: nothing to tap
    net = h.network()
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    assert target(nn.TrainOneStepCell(nn.WithLossCell(net, h.loss_function()), opt)) is None


def test_the_view_is_in_place_only_inside_and_put_back_after_a_failure():
    module = load_mindocr("utils.train_step_wrapper")
    cell = mindocr_cell(2)
    made = []

    def wrap(original, factor):
        made.append((original, factor))
        return lambda variable, value: original(variable, value)

    before = set(sys.modules)
    with pytest.raises(RuntimeError), swapped(cell, wrap) as done:
        view = module.ops
        assert done and view is not ms.ops
        assert view.assign_add is not ms.ops.assign_add
        assert made == [(ms.ops.assign_add, 2.0)]
        # every other name is the same object; MindSpore finds the view by its own name
        assert view.clip_by_global_norm is ms.ops.clip_by_global_norm
        assert sys.modules[view.__name__] is view and view.__name__ != ms.ops.__name__
        raise RuntimeError("the compile failed")
    assert module.ops is ms.ops
    assert set(sys.modules) == before


def test_any_other_cell_compiles_as_it_is():
    net = h.network()
    cell = nn.TrainOneStepCell(
        nn.WithLossCell(net, h.loss_function()), nn.Momentum(net.trainable_params(), 0.01, 0.9)
    )
    with swapped(cell, lambda original, factor: pytest.fail("wrapped")) as done:
        assert not done
