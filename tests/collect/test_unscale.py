"""How an optimizer's own code undoes a loss scale (``collect.unscale``), read from the
code of real classes: MindSpore's, and optimizers written here the ways users write them
(source read by ``inspect``, as for any class on disk). MindCV's: tests/trainers."""

from __future__ import annotations

import mindspore as ms
import pytest
from mindspore import Tensor, nn, ops

from msmon_nb.collect.tensors import to_float
from msmon_nb.collect.unscale import CONVENTION, OWN, UNKNOWN, received_factor, undo_rule

_scale = ops.MultitypeFuncGraph("test_unscale_scale")


@_scale.register("Tensor", "Tensor")
def _scale_tensor(scale, grad):
    return grad * scale


class OwnScale(nn.Optimizer):
    """MindCV's way: loss_scale kept from nn.Optimizer, a reciprocal of its own."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0):
        super().__init__(learning_rate, params)
        self.reciprocal_scale = Tensor(1.0 / loss_scale, ms.float32)
        self.map_ = ops.HyperMap()

    def construct(self, gradients):
        gradients = self.map_(ops.partial(_scale, self.reciprocal_scale), gradients)
        return self._apply(gradients)

    def _apply(self, gradients):
        lr = self.get_lr()
        for p, g in zip(self.parameters, gradients):  # noqa: B905 -- graph syntax
            ops.assign(p, p - lr * g)
        return True


class ByHelper(nn.Optimizer):
    """The convention, reached through a method of its own."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0):
        super().__init__(learning_rate, params, loss_scale=loss_scale)

    def construct(self, gradients):
        return self._update(gradients)

    def _update(self, gradients):
        gradients = self.scale_grad(gradients)
        lr = self.get_lr()
        for p, g in zip(self.parameters, gradients):  # noqa: B905 -- graph syntax
            ops.assign(p, p - lr * g)
        return True


class UnderNeedScale(nn.Optimizer):
    """The convention spelt out: reciprocal_scale only where need_scale."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0):
        super().__init__(learning_rate, params, loss_scale=loss_scale)
        self.map_ = ops.HyperMap()

    def construct(self, gradients):
        if self.need_scale:
            gradients = self.map_(ops.partial(_scale, self.reciprocal_scale), gradients)
        return gradients


class UnderAFlag(nn.Optimizer):
    """reciprocal_scale under a flag of its own: which factor applies depends on it."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0, unscale=True):
        super().__init__(learning_rate, params)
        self.reciprocal_scale = Tensor(1.0 / loss_scale, ms.float32)
        self.unscale = unscale
        self.map_ = ops.HyperMap()

    def construct(self, gradients):
        if self.unscale:
            gradients = self.map_(ops.partial(_scale, self.reciprocal_scale), gradients)
        return gradients


class OtherName(nn.Optimizer):
    """A scale kept under a name of its own."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0):
        super().__init__(learning_rate, params, loss_scale=loss_scale)
        self.inv_scale = Tensor(1.0 / loss_scale, ms.float32)
        self.map_ = ops.HyperMap()

    def construct(self, gradients):
        return self.map_(ops.partial(_scale, self.inv_scale), gradients)


class NeverUndoes(nn.Optimizer):
    """Told the scale (need_scale), never divides by it: MindCV's NAdam's shape."""

    def __init__(self, params, learning_rate=0.1, loss_scale=1.0):
        super().__init__(learning_rate, params, loss_scale=loss_scale)

    def construct(self, gradients):
        return self.decay_weight(gradients)


def params():
    return nn.Dense(3, 2).trainable_params()


@pytest.mark.parametrize(
    ("cls", "kind", "undoes"),
    [
        (nn.Momentum, CONVENTION, True),
        (nn.Adam, CONVENTION, True),
        (nn.AdamWeightDecay, CONVENTION, False),  # takes no loss_scale at all
        (OwnScale, OWN, True),
        (ByHelper, CONVENTION, True),
        (UnderNeedScale, CONVENTION, True),
        (UnderAFlag, UNKNOWN, False),
        (OtherName, UNKNOWN, False),
        (NeverUndoes, CONVENTION, False),
    ],
)
def test_the_rule_is_read_from_the_code(cls, kind, undoes):
    rule = undo_rule(cls)
    assert (rule.kind, rule.undoes) == (kind, undoes)


@pytest.mark.parametrize(
    ("make", "factor", "note"),
    [
        (lambda p: nn.Momentum(p, 0.1, 0.9), 1.0, None),
        (lambda p: nn.Momentum(p, 0.1, 0.9, loss_scale=8.0), 0.125, None),
        (lambda p: OwnScale(p, loss_scale=8.0), 0.125, None),
        (lambda p: OwnScale(p), 1.0, None),
        (lambda p: UnderAFlag(p), 1.0, None),  # holds no scale: nothing to prove
        (lambda p: UnderAFlag(p, loss_scale=8.0), None, "does not show how it undoes"),
        (lambda p: OtherName(p, loss_scale=8.0), None, "does not show how it undoes"),
        (lambda p: NeverUndoes(p, loss_scale=8.0), 0.125, "never divides"),
        (lambda p: NeverUndoes(p), 1.0, None),
    ],
)
def test_the_factor_each_instance_gets_and_what_the_user_is_told(make, factor, note):
    got, said = received_factor(make(params()), to_float)
    assert got == (None if factor is None else pytest.approx(factor))
    assert (said is None) == (note is None)
    if note is not None:
        assert note in said


def test_a_class_without_source_is_unknown():
    """A construct built at run time (no file to read): where its optimizer holds a scale,
    no factor is claimed; where it holds none, there is nothing to undo."""
    space: dict = {}
    exec("def construct(self, gradients):\n    return gradients", space)
    made = type("Made", (nn.Momentum,), {"construct": space["construct"]})
    assert undo_rule(made).kind == UNKNOWN
    factor, said = received_factor(made(params(), 0.1, 0.9, loss_scale=4.0), to_float)
    assert factor is None and "does not show how it undoes" in said
    assert received_factor(made(params(), 0.1, 0.9), to_float) == (1.0, None)
