"""MindFormers 2.1.0's ``MFTrainOneStepCell`` with global-norm clipping, reproduced.

MindFormers 2.1.0 needs MindSpore 2.11, which PyPI does not have, so its wheel cannot be
imported here. ``MFCell`` below follows ``mindformers/wrapper/wrapper.py``'s
``MFTrainOneStepCell.construct`` (legacy-model path, no local norm, no dump) step for
step: scale the loss by ``scale_sense``, take the scaled gradients, unscale them with
``_grad_scale``, reduce them, check overflow (``get_overflow_status``) and update the
scale (``process_loss_scale``), clip with its own ``ClipGradNorm`` cell (not MindSpore's:
it returns the clipped gradients *and* their norm; ``ClipGradNormLike`` is
``mindformers/core/clip_grad.py``'s), optionally skip the update when that norm passes
``global_norm_spike_threshold``, and return ``(loss, overflow, scale, lr, global_norm)``.
One deviation: on the CPU, ``get_overflow_status`` (Ascend's float-status registers)
fails, so it is replaced by ``amp.all_finite``, which is what it computes.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, amp, nn, ops
from mindspore import dtype as mstype
from mindspore.nn.wrap.loss_scale import _grad_scale

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.reference import assert_same_weights, float64_norm

pytestmark = pytest.mark.usefixtures("graph_mode")

STEPS, BATCH = 10, 8

_square_sum = ops.MultitypeFuncGraph("square_sum")
_apply = ops.MultitypeFuncGraph("apply_global_norm")


@_square_sum.register("Tensor")
def _sq(x):
    return ops.expand_dims(ops.cast(ops.reduce_sum(ops.square(x), ()), mstype.float32), 0)


@_apply.register("Tensor", "Tensor", "Tensor")
def _scale(clip_norm, global_norm, x):
    return ops.cast(x * clip_norm / global_norm, ops.dtype(x))


class ClipGradNormLike(nn.Cell):
    """MindFormers' ``ClipGradNorm``: clips by global norm, returns (clipped, norm)."""

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.clip_norm = Tensor([max_norm], mstype.float32)
        self.hyper_map = ops.HyperMap()

    def construct(self, x):
        global_norm = ops.sqrt(ops.addn(self.hyper_map(_square_sum, x)))
        clip = ops.select(global_norm >= self.clip_norm, global_norm, self.clip_norm)
        return self.hyper_map(ops.partial(_apply, self.clip_norm, clip), x), global_norm


class MFCell(nn.TrainOneStepWithLossScaleCell):
    """``MFTrainOneStepCell``'s construct, as above."""

    def __init__(self, network, optimizer, scale_sense, max_grad_norm, threshold=None):
        super().__init__(network, optimizer, scale_sense)
        self.clip_grad_norm = ClipGradNormLike(max_grad_norm)
        self.skip = threshold is not None
        self.threshold = threshold or 0.0
        self.grad_scale_factor = Tensor([1], dtype=mstype.float32)

    def get_overflow_status(self, status, compute_output):
        return ops.logical_not(amp.all_finite(compute_output))  # the CPU deviation

    def construct(self, *inputs):
        scaling_sens = self.scale_sense
        loss = self.network(*inputs)
        filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, filled)
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        grads = self.hyper_map(
            ops.partial(_grad_scale, scaling_sens * self.grad_scale_factor), grads
        )
        grads = self.grad_reducer(grads)
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        grads, global_norm = self.clip_grad_norm(grads)
        learning_rate = self.optimizer.get_lr()
        if not overflow:
            if self.skip:
                if global_norm < self.threshold:
                    loss = ops.depend(loss, self.optimizer(grads))
            else:
                loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens, learning_rate, global_norm


def batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 16)).astype(np.float32)
    y = rng.integers(0, 4, size=STEPS * BATCH).astype(np.int32)
    return [(Tensor(x[i : i + BATCH]), Tensor(y[i : i + BATCH])) for i in range(0, len(y), BATCH)]


def build(dynamic: bool):
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 64), nn.ReLU(), nn.Dense(64, 4)])
    net[-1].to_float(ms.float16)  # mixed precision: the head overflows at large scales
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2)
    scale = (
        nn.DynamicLossScaleUpdateCell(2.0**16, scale_factor=2, scale_window=3)
        if dynamic
        else Tensor(1024.0, mstype.float32)
    )
    return net, loss, opt, MFCell(loss, opt, scale, max_grad_norm=0.3)


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_mindformers_cell(tmp_path, dynamic):
    net, loss, opt, cell = build(dynamic)

    def forward(x, y):
        return loss(x, y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    expected = []
    for x, y in batches():
        _, grads = grad_fn(x, y)
        used = float(cell.scale_sense.asnumpy())  # the scale this step's gradients carry
        out = cell(x, y)
        expected.append((float64_norm(grads), used, bool(out[1].asnumpy())))
    plain = net

    net, loss, opt, cell = build(dynamic)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for x, y in batches():
            cell(x, y)
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist() == list(range(STEPS))
    flags = run.scalars("train/overflow").values.astype(bool).tolist()
    assert flags == [e[2] for e in expected]
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, [e[1] for e in expected])
    good = [s for s, e in enumerate(expected) if not e[2]]
    if dynamic:
        assert 0 < len(good) < STEPS  # overflow steps happened, and normal ones
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == good
    # the float16 head's gradients round differently scaled than unscaled
    np.testing.assert_allclose(grad_norm.values, [expected[s][0] for s in good], rtol=1e-2)
    clipped = run.scalars("train/grad_norm_clipped")
    assert clipped.steps.tolist() == good
    np.testing.assert_allclose(clipped.values, 0.3, rtol=1e-3)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain.trainable_params())


def test_nan_forward_loss_on_a_handled_overflow_is_no_alert(tmp_path):
    """A float16 forward that overflows (one batch of huge inputs): the loss is NaN, the
    cell's check catches it, skips the update and halves the scale. That step's loss is
    recorded as it is (NaN), with train/overflow 1 and no ``nonfinite`` alert; the
    steps after it train and record as usual. (Before: a critical ``nonfinite``.)"""
    data = batches()
    x, y = data[3]
    data[3] = (x * 1e6, y)  # float16 head: inf logits, NaN loss
    net, _, _, cell = build(dynamic=True)
    plain_flags = []
    for x, y in data:
        plain_flags.append(bool(cell(x, y)[1].asnumpy()))
    assert plain_flags[3]
    plain = net
    net, _, _, cell = build(dynamic=True)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for x, y in data:
            cell(x, y)
    run = load_run(mon.run_dir)
    losses = run.scalars("train/loss")
    assert losses.steps.tolist() == list(range(STEPS))
    assert np.isnan(losses.values[3]) and np.isfinite(np.delete(losses.values, 3)).all()
    assert run.scalars("train/overflow").values.astype(bool).tolist() == plain_flags
    assert 3 not in run.scalars("train/grad_norm").steps.tolist()
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain.trainable_params())
