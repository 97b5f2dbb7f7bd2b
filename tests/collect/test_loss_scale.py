"""MindSpore's own loss-scaling and clipping recipes, monitored unchanged: grad_norm is
the gradient as the model produced it (loss scale undone, before clipping), the loss is
the unscaled one, one optimizer call is one step, and training is bit-identical.

(Third-party trainers are in tests/trainers.)
"""

from __future__ import annotations

import math
import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.amp import StaticLossScaler, all_finite
from mindspore.train import FixedLossScaleManager, Model

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny
from tests.support.reference import Reference, assert_same_weights, float64_norm

STEPS, BATCH = 8, 16


def batches():
    x, y = tiny.data(n=STEPS * BATCH)
    return [
        (ms.Tensor(x[i : i + BATCH]), ms.Tensor(y[i : i + BATCH])) for i in range(0, len(y), BATCH)
    ]


@pytest.mark.parametrize(
    ("level", "paired"), [("O0", True), ("O2", True), ("O0", False)], ids=["O0", "O2", "unpaired"]
)
def test_model_train_with_fixed_loss_scale_manager(tmp_path, level, paired):
    """``FixedLossScaleManager(1024, drop_overflow_update=False)`` with the optimizer made
    with ``loss_scale=1024``, as MindSpore's docs pair them: the train cell seeds the
    backward with 1024 and the optimizer divides it out. ``unpaired``: the optimizer made
    without it (nothing checks the pairing): its update applies 1024x the gradient
    (here with an lr 1024x smaller, so that it trains); grad_norm is still the unscaled
    one, and one warning says what the update does."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        x, y = tiny.data(n=STEPS * BATCH)

        def build():
            net = tiny.mlp(seed=4)
            params = net.trainable_params()
            if paired:
                opt = nn.Momentum(params, 0.05, 0.9, loss_scale=1024.0)
            else:
                opt = nn.Momentum(params, 0.05 / 1024, 0.9)
            manager = FixedLossScaleManager(1024.0, drop_overflow_update=False)
            return net, Model(net, tiny.loss_fn(), opt, amp_level=level, loss_scale_manager=manager)

        def dataset():
            return mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)

        net, model = build()
        ref = Reference(nn.WithLossCell(net, tiny.loss_fn()), net.trainable_params(), batches())
        model.train(1, dataset(), callbacks=[ref], dataset_sink_mode=False)
        net, model = build()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
                model.train(1, dataset(), callbacks=[mon.callback()], dataset_sink_mode=False)
        plain, model = build()
        model.train(1, dataset(), dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    unpaired = [str(w.message) for w in said if "does not divide by it" in str(w.message)]
    assert len(unpaired) == (0 if paired else 1), unpaired
    if not paired:
        assert "its update applies 1024x" in unpaired[0]
    run = load_run(mon.run_dir)
    rtol = 1e-5 if level == "O0" else 2e-3  # O2 runs the layers in float16
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, ref.norms, rtol=rtol)
    np.testing.assert_allclose(run.scalars("train/loss").values, ref.losses, rtol=rtol)
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, 1024.0)
    assert not mon.alerts
    assert_same_weights(net.trainable_params(), plain.trainable_params())


def amp_recipe(jit: bool, clip: float = 0.0):
    """The mixed-precision recipe of MindSpore's tutorials, with a static scaler (and
    optionally ``ops.clip_by_global_norm`` after unscaling)."""
    net = tiny.mlp(seed=5)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    scaler = StaticLossScaler(1024.0)

    def forward(data, label):
        return scaler.scale(loss_fn(net(data), label))

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())

    def train_step(data, label):
        loss, grads = grad_fn(data, label)
        loss = scaler.unscale(loss)
        finite = all_finite(grads)
        if finite:
            grads = scaler.unscale(grads)
            if clip:
                grads = ops.clip_by_global_norm(grads, clip)
            opt(grads)
        scaler.adjust(finite)
        return loss

    return net, loss_fn, (ms.jit(train_step) if jit else train_step)


@pytest.mark.parametrize("clip", [0.0, 0.5], ids=["scaled", "clipped"])
@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_amp_loss_scaler_recipe(tmp_path, jit, clip):
    net, loss_fn, step = amp_recipe(jit, clip)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())
    expected = []
    for a, b in batches():
        loss, grads = grad_fn(a, b)
        expected.append((float(loss.asnumpy()), float64_norm(grads)))
        step(a, b)
    plain = net
    net, _, step = amp_recipe(jit, clip)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for a, b in batches():
            step(a, b)
    run = load_run(mon.run_dir)
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == list(range(STEPS))  # not split by scale/unscale/all_finite
    np.testing.assert_allclose(loss.values, [e[0] for e in expected], rtol=1e-5)
    np.testing.assert_allclose(
        run.scalars("train/grad_norm").values, [e[1] for e in expected], rtol=1e-4
    )
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, 1024.0)
    assert run.scalars("train/overflow").values.tolist() == [0.0] * STEPS
    if clip:
        assert min(e[1] for e in expected) > clip
        np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, clip, rtol=1e-4)
    else:
        assert "train/grad_norm_clipped" not in run.tags
    assert not mon.alerts
    assert_same_weights(net.trainable_params(), plain.trainable_params())


@pytest.mark.parametrize("how", ["clip_by_norm", "ClipByNorm"])
def test_other_clip_functions_give_the_norm_before_clipping(tmp_path, how):
    """``ops.clip_by_norm`` (the whole tuple) and ``nn.ClipByNorm`` (one tensor a call)."""
    net = tiny.mlp(seed=6)
    loss_fn = tiny.loss_fn()
    opt = nn.SGD(net.trainable_params(), 0.1)
    clip_one = nn.ClipByNorm() if how == "ClipByNorm" else None

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, net.trainable_params())
    norms, clipped = [], []
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for a, b in batches():
            _, grads = grad_fn(a, b)
            norms.append(float64_norm(grads))
            if clip_one is None:
                grads = ops.clip_by_norm(grads, 0.2)
            else:
                grads = tuple(clip_one(g, ms.Tensor(0.05, ms.float32)) for g in grads)
            clipped.append(float64_norm(grads))
            opt(grads)
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-4)
    np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, clipped, rtol=1e-4)


def test_float16_gradients_are_summed_in_float32(tmp_path):
    """A float16 sum of squares overflows past a norm of 256: the host path widens."""
    grads = [
        ms.Tensor(np.full((64, 64), 8.0, np.float16)),
        ms.Tensor(np.full((8,), 100.0, np.float16)),
    ]
    expected = math.sqrt(64 * 64 * 64.0 + 8 * 10000.0)
    assert expected > 256
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0, grads=grads)
        mon.step(loss=1.0, grads=[g.astype(ms.bfloat16) for g in grads])
    np.testing.assert_allclose(
        load_run(mon.run_dir).scalars("train/grad_norm").values, expected, rtol=1e-6
    )
