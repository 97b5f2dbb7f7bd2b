"""MindYOLO 0.5.0's train step (``create_train_step_fn``, from PyPI), unchanged, under
``mon.watch()``: a functional ``value_and_grad`` step that scales the loss with
``mindspore.amp``'s ``StaticLossScaler``/``DynamicLossScaler`` (MindYOLO's
``get_loss_scaler``), unscales, checks ``all_finite``, clips with
``ops.clip_by_global_norm`` and calls the optimizer -- in PyNative and compiled with
``ms_jit=True``, driven as MindYOLO's ``Trainer`` drives it (``scaler.adjust`` after each
step). The network is built from MindYOLO's own layers (``ConvNormAct``, ``C2f``).
"""

from __future__ import annotations

import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from mindyolo.models.layers import C2f, ConvNormAct
from mindyolo.utils.train_step_factory import (
    create_train_step_fn,
    get_gradreducer,
    get_loss_scaler,
)

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.reference import assert_same_weights, float64_norm

BATCH, STEPS = 4, 8


def network(half: bool) -> nn.Cell:
    net = nn.SequentialCell(
        [
            ConvNormAct(3, 8, 3, 2),
            C2f(8, 8, 1),
            ConvNormAct(8, 8, 3, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dense(8, 4),
        ]
    )
    if half:  # the heads in float16, as mixed precision runs them (BN stays float32)
        net[-1].to_float(ms.float16)
    return net


def make_loss(weight: float):
    def loss_fn(pred, label, x):
        """A detection loss's shape: (loss, loss items), float32."""
        loss = ((ops.cast(pred, ms.float32) - label) ** 2).mean() * weight
        return loss, ops.stack([loss])

    return loss_fn


def batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 3, 16, 16)).astype(np.float32)
    y = rng.normal(size=(BATCH * STEPS, 4)).astype(np.float32)
    return [
        (ms.Tensor(x[i : i + BATCH]), ms.Tensor(y[i : i + BATCH])) for i in range(0, len(y), BATCH)
    ]


def build(jit: bool, clip: float, scaler: str, scale: float, half: bool = False):
    """With ``half``, the loss weight makes the float16 head overflow at 2**16 about
    every fourth step (a weight of 50 overflowed every step down to 2**11, 1 never)."""
    loss_fn = make_loss(5.0 if half else 50.0)
    ms.set_seed(0)
    net = network(half)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    loss_scaler = get_loss_scaler(scaler, scale_value=scale, scale_factor=2, scale_window=3)
    step = create_train_step_fn(
        "detect", net, loss_fn, opt, 1.0, loss_scaler, get_gradreducer(False, opt.parameters),
        ms_jit=jit, clip_grad=clip > 0, clip_grad_value=clip or 10.0,
    )  # fmt: skip
    return net, opt, step, loss_scaler


def drive(step, scaler):
    """MindYOLO's Trainer.train loop for one step (accumulate=1)."""
    for x, y in batches():
        out = step(x, y, True)
        scaler.adjust(out[3])


def twin(jit, clip, scaler, scale, half=False):
    """Expected per step: (unscaled loss, unscaled pre-clip norm, scale, overflowed)."""
    net, opt, step, loss_scaler = build(jit, clip, scaler, scale, half)
    loss_fn = make_loss(5.0 if half else 50.0)

    def forward(x, y):
        return loss_fn(net(x), y, x)[0]

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    expected = []
    for x, y in batches():
        loss, grads = grad_fn(x, y)
        used = float(loss_scaler.scale_value.asnumpy())
        out = step(x, y, True)
        loss_scaler.adjust(out[3])
        expected.append((float(loss.asnumpy()), float64_norm(grads), used, not bool(out[3])))
    return expected, net


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "ms_jit"])
@pytest.mark.parametrize("clip", [0.0, 2.0], ids=["scaled", "clip"])
def test_static_loss_scale_and_clipping(tmp_path, jit, clip):
    expected, plain_net = twin(jit, clip, "static", 1024.0)
    net, _, step, scaler = build(jit, clip, "static", 1024.0)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        drive(step, scaler)
    run = load_run(mon.run_dir)
    steps = list(range(STEPS))
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == steps  # one step per optimizer call, whatever runs around it
    np.testing.assert_allclose(loss.values, [e[0] for e in expected], rtol=1e-4)
    np.testing.assert_allclose(
        run.scalars("train/grad_norm").values, [e[1] for e in expected], rtol=1e-3
    )
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, 1024.0)
    np.testing.assert_allclose(run.scalars("train/learning_rate").values, 0.02, rtol=1e-6)
    if clip:
        assert min(e[1] for e in expected) > clip
        np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, clip, rtol=1e-3)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "ms_jit"])
def test_dynamic_loss_scale_overflow_is_marked_not_alerted(tmp_path, jit):
    """A float16 head with the dynamic scaler at 2**16 overflows; the scaler halves the
    scale, skips the update, and doubles it back after 3 good steps, overflowing again.
    Those steps are ``train/overflow`` 1, have no grad_norm, and raise no alert."""
    expected, plain_net = twin(jit, 0.0, "dynamic", 65536.0, half=True)
    overflowed = [s for s, e in enumerate(expected) if e[3]]
    assert len(overflowed) >= 2 and overflowed[0] == 0  # the injected overflows happen
    scales = [e[2] for e in expected]
    low = scales.index(min(scales))
    assert min(scales) < 65536.0 and max(scales[low:]) > min(scales)  # halved, doubled back
    net, _, step, scaler = build(jit, 0.0, "dynamic", 65536.0, half=True)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        drive(step, scaler)
    run = load_run(mon.run_dir)
    flags = run.scalars("train/overflow")
    assert flags.steps.tolist() == list(range(STEPS))
    assert [s for s, v in zip(flags.steps, flags.values, strict=True) if v == 1.0] == overflowed
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, scales)
    grad_norm = run.scalars("train/grad_norm")
    good = [s for s in range(STEPS) if s not in overflowed]
    assert grad_norm.steps.tolist() == good
    # float16 gradients: scaled then unscaled, or taken unscaled, round differently
    np.testing.assert_allclose(grad_norm.values, [expected[s][1] for s in good], rtol=2e-2)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


ACCUMULATE = 2


def _add(a, b):
    return a + b


def drive_accumulating(step, scaler, opt, reference=None):
    """MindYOLO's ``Trainer.train_step`` with ``accumulate=2``: each call returns the
    unscaled gradients (``optimizer_update=False``), the host adds them up (a sum, not a
    mean: its ``_get_accumulate_grads_fn``) and calls the optimizer on every 2nd. With
    ``reference`` (the twin's net and loss), returns per update (the micro-batches'
    losses, the float64 norm of their summed unscaled gradients, each micro-batch's
    float64 norm), taken before it."""
    hyper_map = ops.HyperMap()
    grad_fn = None
    if reference is not None:
        net, loss_fn = reference
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y, x)[0], None, opt.parameters)
    expected, held, micro = [], None, []
    for i, (x, y) in enumerate(batches()):
        if grad_fn is not None:
            loss, grads = grad_fn(x, y)
            micro.append((float(loss.asnumpy()), [g.asnumpy().astype(np.float64) for g in grads]))
        _, _, grads, finite = step(x, y, False)
        scaler.adjust(finite)
        held = grads if held is None else hyper_map(_add, held, grads)
        if (i + 1) % ACCUMULATE == 0:
            if micro:
                summed = [sum(gs) for gs in zip(*(g for _, g in micro), strict=True)]
                norm = float(np.sqrt(sum(float((g * g).sum()) for g in summed)))
                each = [float(np.sqrt(sum(float((g * g).sum()) for g in m[1]))) for m in micro]
                expected.append(([m[0] for m in micro], norm, each))
                micro = []
            opt(held)
            held = None
    return expected


def accumulated_under_watch(tmp_path, jit: bool, clip: float):
    """MindYOLO's host accumulation (``accumulate=2``, a static scale of 1024) trained
    plain, then again under ``mon.watch()``: (the plain twin's expected values per
    update, the monitor, its run, what msmon warned, a check that both ended with the
    same weights)."""
    plain_net, plain_opt, plain_step, plain_scaler = build(jit, clip, "static", 1024.0)
    expected = drive_accumulating(plain_step, plain_scaler, plain_opt, (plain_net, make_loss(50.0)))
    net, opt, step, scaler = build(jit, clip, "static", 1024.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
            drive_accumulating(step, scaler, opt)
    told = [str(w.message) for w in caught if w.category.__module__.startswith("msmon")]

    def same_weights() -> None:
        assert_same_weights(net.trainable_params(), plain_net.trainable_params())

    return expected, mon, load_run(mon.run_dir), told, same_weights


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "ms_jit"])
def test_host_accumulation_of_micro_batches(tmp_path, jit):
    """``accumulate=2`` (MindYOLO's host-side accumulation, a static scale of 1024): one
    step per optimizer call; its grad_norm is the norm of what the optimizer applied,
    the sum of the two micro-batches' unscaled gradients; its micro_grad_norm the larger
    micro-batch's unscaled norm.

    With ``ms_jit`` each micro-batch is a jit call whose graph returns the gradients and
    holds no optimizer (``optimizer_update=False``): before the fix the first one was
    recorded as a step of its own (5 steps for 4 updates) whose grad_norm was the step's
    second output, MindYOLO's ``loss_items`` (the loss, 64.6, for a norm of 41.4)."""
    expected, mon, run, told, same_weights = accumulated_under_watch(tmp_path, jit, 0.0)
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == list(range(STEPS // ACCUMULATE)), told
    np.testing.assert_allclose(grad_norm.values, [e[1] for e in expected], rtol=1e-3)
    micro = run.scalars("train/micro_grad_norm")
    assert micro.steps.tolist() == grad_norm.steps.tolist(), told
    np.testing.assert_allclose(micro.values, [max(e[2]) for e in expected], rtol=1e-3)
    assert not [t for t in told if "grad_norm" in t], told  # nothing missing to say
    # the last micro-batch's loss: what the step returned when the update ran, and what
    # MindYOLO's Trainer logs (DESIGN.md says the mean of the micro-batches': not so in
    # function loops, here or in tests/conformance's accumulating PyNative case)
    np.testing.assert_allclose(
        run.scalars("train/loss").values, [e[0][-1] for e in expected], rtol=1e-4
    )
    assert not mon.alerts, [a.message for a in mon.alerts]
    same_weights()


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "ms_jit"])
def test_host_accumulation_clipping_each_micro_batch_is_said_not_hidden(tmp_path, jit):
    """``accumulate=2`` with ``clip_grad``: MindYOLO clips each micro-batch's gradients
    before the host adds them, so the accumulated gradient before clipping never exists:
    no grad_norm, one warning; micro_grad_norm is each micro-batch's norm before
    clipping (as for MindCV's TrainStep, ``test_mindcv.py``).

    Before the watch noted clip calls between micro-batches, grad_norm here was the root
    of the summed squares of both clip inputs (43.31 for an accumulated norm of 41.37),
    unwarned, and with ``ms_jit`` micro_grad_norm the clipped norm (2.0)."""
    expected, _, run, told, same_weights = accumulated_under_watch(tmp_path, jit, 2.0)
    assert "train/grad_norm" not in list(run.tags()), told
    assert sum("clips each micro-batch" in t for t in told) == 1, told
    micro = run.scalars("train/micro_grad_norm")
    np.testing.assert_allclose(micro.values, [max(e[2]) for e in expected], rtol=1e-3)
    same_weights()
