"""MindCV 0.3.0's own trainer (``create_trainer``, from PyPI), unchanged, monitored with
``mon.callback()`` under ``Model.train`` in GRAPH_MODE, against an unmonitored twin.

MindCV builds either MindSpore's ``Model`` with ``FixedLossScaleManager(1024,
drop_overflow_update=False)`` (a ``TrainOneStepCell`` with ``sens=1024`` and the
optimizer made with ``loss_scale=1024``: the optimizer receives 1024x the gradient) or,
for clipping, EMA or accumulation, its ``TrainStep`` (a ``TrainOneStepWithLossScaleCell``
subclass that unscales, clips with ``ops.clip_by_global_norm`` and accumulates through
its ``GradientAccumulation`` cell). The model is MindCV's ``mobilenet_v1_025`` from its
own ``create_model``; the loss and optimizer from its ``create_loss``/``create_optimizer``.
Before these changes the recorded grad_norm was the clip value at every step, or 1024x
the real norm.
"""

from __future__ import annotations

import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindcv.loss import create_loss
from mindcv.models import create_model
from mindcv.optim import create_optimizer
from mindcv.utils import create_trainer

from msmon_nb.collect.tensors import to_float
from msmon_nb.collect.unscale import CONVENTION, OWN, undo_rule
from msmon_nb.collect.values import read_lr
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.reference import Reference, assert_same_weights

pytestmark = pytest.mark.usefixtures("graph_mode")

BATCH, STEPS = 4, 6


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=BATCH * STEPS).astype(np.int32)
    return x, y


def build(clip: float = 0.0, ema: bool = False, accumulate: int = 1):
    """MindCV's factories, set up as its train.py sets them up: the optimizer carries the
    loss scale only where MindSpore's plain ``Model`` is used."""
    custom = clip > 0 or ema or accumulate > 1
    ms.set_seed(0)
    net = create_model("mobilenet_v1_025", num_classes=10)
    loss = create_loss(name="CE")
    opt = create_optimizer(
        net.trainable_params(), opt="momentum", lr=0.05, loss_scale=1.0 if custom else 1024.0
    )
    model = create_trainer(
        net, loss, opt, metrics=None, amp_level="O0", amp_cast_list=None,
        loss_scale_type="fixed", loss_scale=1024.0, drop_overflow_update=False,
        ema=ema, clip_grad=clip > 0, clip_value=clip or 15.0,
        gradient_accumulation_steps=accumulate,
    )  # fmt: skip
    return net, loss, model


def train(model, callbacks):
    x, y = data()
    dataset = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)


def twin(clip=0.0, ema=False, accumulate=1):
    """The unmonitored reference run (gradients taken before each update) and its net.
    Its extra forward passes move BatchNorm's running statistics, never the trainable
    weights (a training-mode forward uses the batch's own statistics), so its trainable
    weights are what the monitored run's must equal."""
    x, y = data()
    batches = [
        (ms.Tensor(x[i : i + BATCH]), ms.Tensor(y[i : i + BATCH])) for i in range(0, len(y), BATCH)
    ]
    net, loss, model = build(clip, ema, accumulate)
    ref = Reference(ms.nn.WithLossCell(net, loss), net.trainable_params(), batches)
    train(model, [ref])
    return ref, net


@pytest.fixture(scope="module")
def twins():
    """``twin(...)``, run once per configuration in this module: the clip test and the
    watch test check against the same clip=0.5 twin (a twin only reads the suite's
    trainer; nothing writes to it after it ran). Saves one mobilenet twin, ~10 s of CPU."""
    done: dict[tuple, tuple] = {}

    def get(clip: float = 0.0, ema: bool = False, accumulate: int = 1):
        key = (clip, ema, accumulate)
        if key not in done:
            done[key] = twin(clip, ema, accumulate)
        return done[key]

    return get


def monitored(tmp_path, clip=0.0, ema=False, accumulate=1):
    net, _, model = build(clip, ema, accumulate)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
        train(model, [mon.callback()])
    return net, mon, load_run(mon.run_dir)


@pytest.mark.parametrize(
    ("clip", "ema"), [(0.0, False), (0.5, False), (0.5, True)], ids=["scaled", "clip", "clip+ema"]
)
def test_grad_norm_is_unscaled_and_before_clipping(tmp_path, twins, clip, ema):
    ref, plain_net = twins(clip, ema)
    net, mon, run = monitored(tmp_path, clip, ema)
    steps = list(range(1, STEPS + 1))
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == steps
    np.testing.assert_allclose(grad_norm.values, ref.norms, rtol=1e-3)
    np.testing.assert_allclose(run.scalars("train/loss").values, ref.losses, rtol=1e-5)
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, 1024.0)
    np.testing.assert_allclose(run.scalars("train/learning_rate").values, 0.05, rtol=1e-6)
    if clip:
        assert min(ref.norms) > clip  # the clip acted at every step
        np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, clip, rtol=1e-3)
    else:
        assert "train/grad_norm_clipped" not in run.tags
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


def test_accumulation_records_the_applied_gradient(tmp_path, twins):
    """``gradient_accumulation_steps=2``: MindCV adds grad/2 of each micro-batch and steps
    the optimizer on every second ``Model.train`` step: grad_norm is the norm of that
    mean, on the steps that apply it. Each step's micro-batch gradient is seen inside
    MindCV's graph, where MindSpore's accumulation op adds it to the buffer:
    micro_grad_norm is that micro-batch's norm on every step (before, one warning said it
    was not recorded)."""
    ref, plain_net = twins(accumulate=2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        net, mon, run = monitored(tmp_path, accumulate=2)
    assert not [w for w in said if "micro_grad_norm is not recorded" in str(w.message)]
    micro = run.scalars("train/micro_grad_norm")
    assert micro.steps.tolist() == list(range(1, STEPS + 1))
    np.testing.assert_allclose(micro.values, ref.norms, rtol=1e-3)
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == list(range(2, STEPS + 1, 2))
    expected = [ref.accumulated_norm(s - 2, 2) for s in grad_norm.steps]
    np.testing.assert_allclose(grad_norm.values, expected, rtol=1e-3)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


def test_clipping_each_micro_batch_is_said_not_hidden(tmp_path, twins):
    """Accumulation with clipping: MindCV clips every micro-batch before adding it, so no
    unclipped accumulated gradient exists. grad_norm stays empty (a warning says why);
    each micro-batch's norm before clipping and the clipped sum are recorded."""
    ref, plain_net = twins(clip=0.5, accumulate=2)
    with pytest.warns(UserWarning, match="clips each micro-batch"):
        net, mon, run = monitored(tmp_path, clip=0.5, accumulate=2)
    assert "train/grad_norm" not in run.tags
    assert not mon.alerts, [a.message for a in mon.alerts]  # metric_missing knows why
    micro = run.scalars("train/micro_grad_norm")
    assert micro.steps.tolist() == list(range(1, STEPS + 1))
    np.testing.assert_allclose(micro.values, ref.norms, rtol=1e-3)
    clipped = run.scalars("train/grad_norm_clipped")
    assert clipped.steps.tolist() == list(range(2, STEPS + 1, 2))
    assert (clipped.values <= 0.5 * 1.001).all()
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


def test_under_a_watch_the_callback_is_added_and_taps_do_not_stack(tmp_path, twins):
    """``%%msmonitor`` on a ``Model.train`` cell: the watch adds the callback and steps
    aside (its own clip and optimizer wrappers are lifted while ``Model.train`` runs), so
    the compiled graph holds one set of wrappers."""
    ref, ref_net = twins(clip=0.5)
    net, _, model = build(clip=0.5)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        train(model, [])
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, ref.norms, rtol=1e-3)
    np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, 0.5, rtol=1e-3)
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), ref_net.trainable_params())


@pytest.mark.parametrize("opt", ["adamw", "lion", "nadam", "adan"])
def test_the_loss_scale_is_undone_however_the_optimizer_undoes_it(tmp_path, opt):
    """MindCV's documented fixed-scale recipe: ``create_optimizer(..., loss_scale=1024)``
    and ``create_trainer(..., loss_scale_type="fixed", loss_scale=1024,
    drop_overflow_update=False)``, which builds MindSpore's ``Model`` with a
    ``TrainOneStepCell(sens=1024)``: the optimizer receives 1024x the gradient. AdamW and
    Lion undo it with a ``reciprocal_scale`` of their own (``need_scale`` stays False:
    grad_norm read 1024x before), Adan by ``nn.Optimizer``'s convention, and NAdam never
    (its update uses the scaled gradients: said once; grad_norm is still the unscaled
    one). A linear classifier: the optimizer, loss and trainer are MindCV's."""

    def make():
        ms.set_seed(0)
        net = ms.nn.SequentialCell([ms.nn.Flatten(), ms.nn.Dense(3 * 32 * 32, 10)])
        optimizer = create_optimizer(net.trainable_params(), opt=opt, lr=1e-3, loss_scale=1024.0)
        loss = create_loss(name="CE")
        model = create_trainer(
            net, loss, optimizer, metrics=None, amp_level="O0", amp_cast_list=None,
            loss_scale_type="fixed", loss_scale=1024.0, drop_overflow_update=False,
        )  # fmt: skip
        return net, loss, model

    x, y = data()
    batches = [
        (ms.Tensor(x[i : i + BATCH]), ms.Tensor(y[i : i + BATCH])) for i in range(0, len(y), BATCH)
    ]
    plain_net, loss, model = make()
    ref = Reference(ms.nn.WithLossCell(plain_net, loss), plain_net.trainable_params(), batches)
    train(model, [ref])
    net, _, model = make()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
            train(model, [mon.callback()])
    run = load_run(mon.run_dir)
    grad_norm = run.scalars("train/grad_norm")
    assert grad_norm.steps.tolist() == list(range(1, STEPS + 1))
    np.testing.assert_allclose(grad_norm.values, ref.norms, rtol=1e-3)
    never = [str(w.message) for w in said if "never divides" in str(w.message)]
    assert len(never) == (1 if opt == "nadam" else 0), never
    assert not mon.alerts, [a.message for a in mon.alerts]
    assert_same_weights(net.trainable_params(), plain_net.trainable_params())


@pytest.mark.parametrize("opt", ["adamw", "lion", "adan"])
def test_optimizers_whose_get_lr_moves_global_step_train_as_without_us(tmp_path, opt):
    """Issue 32: MindCV's AdamW, Lion and Adan advance ``global_step`` inside ``get_lr()``.
    Under monitoring a second ``get_lr()`` per update ran the warmup-cosine schedule at
    double pace and crashed at its end (``Gather`` index 24 out of [0, 24) for adamw).
    Now: the whole schedule runs, recorded as the schedule says, and the weights, moments
    and ``global_step`` are those of the unmonitored run, bit for bit. (The model is a
    linear classifier: the optimizer, schedule, loss and trainer are MindCV's; a
    mobilenet's compile would triple the test's time and show nothing more.)"""
    from mindcv.scheduler import create_scheduler

    def make():
        ms.set_seed(0)
        net = ms.nn.SequentialCell([ms.nn.Flatten(), ms.nn.Dense(3 * 32 * 32, 10)])
        schedule = create_scheduler(
            STEPS, "cosine_decay", lr=1e-4, min_lr=1e-6, warmup_epochs=1, num_epochs=2
        )
        optimizer = create_optimizer(net.trainable_params(), opt=opt, lr=schedule)
        model = create_trainer(
            net, create_loss(name="CE"), optimizer, metrics=None, amp_level="O0",
            amp_cast_list=None, loss_scale_type="fixed", loss_scale=1.0,
            drop_overflow_update=False,
        )  # fmt: skip
        return net, optimizer, model, schedule

    def state(optimizer):
        return {p.name: p.asnumpy().copy() for p in optimizer.get_parameters()}

    _, plain_opt, model, schedule = make()
    train(model, [])
    train(model, [])  # a second epoch: the schedule's end, where the crash was
    _, opt_, model, _ = make()
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
        train(model, [mon.callback()])
        train(model, [mon.callback()])
    plain, monitored = state(plain_opt), state(opt_)
    assert plain.keys() == monitored.keys()
    assert all(np.array_equal(plain[k], monitored[k]) for k in plain), "optimizer state moved"
    assert int(monitored["global_step"].reshape(-1)[0]) == 2 * STEPS
    lr = load_run(mon.run_dir).scalars("train/learning_rate")
    assert lr.steps.tolist() == list(range(1, 2 * STEPS + 1))
    np.testing.assert_array_equal(lr.values, np.float32(schedule[: 2 * STEPS]))
    assert not mon.alerts, [a.message for a in mon.alerts]


def test_mindcv_adamw_global_step_never_moves() -> None:
    """MindCV's AdamW advances ``global_step`` inside ``get_lr()``: reading its lr any
    number of times leaves it where it was (the crash of issue 32 came from a second
    ``get_lr()`` per update)."""
    net = ms.nn.Dense(4, 2)
    opt = create_optimizer(net.trainable_params(), opt="adamw", lr=[0.1, 0.2, 0.3])
    for _ in range(5):
        assert read_lr(opt) == pytest.approx(0.1)
    assert int(opt.global_step.asnumpy().reshape(-1)[0]) == 0


def test_mindcv_optimizers_rules():
    """MindCV 0.3.0: AdamW and Lion undo the scale with their own reciprocal (need_scale
    stays False); Adan by the convention; NAdam is told the scale and never undoes it."""
    kinds = {}
    for name in ("adamw", "lion", "adan", "nadam", "momentum", "sgd"):
        opt = create_optimizer(
            ms.nn.Dense(3, 2).trainable_params(), opt=name, lr=0.1, loss_scale=1024.0
        )
        rule = undo_rule(type(opt))
        kinds[name] = (rule.kind, rule.undoes, rule.factor(opt, to_float))
    assert kinds["adamw"] == (OWN, True, pytest.approx(1 / 1024))
    assert kinds["lion"] == (OWN, True, pytest.approx(1 / 1024))
    assert kinds["adan"] == (CONVENTION, True, pytest.approx(1 / 1024))
    assert kinds["nadam"] == (CONVENTION, False, pytest.approx(1 / 1024))
    assert kinds["momentum"][2] == pytest.approx(1 / 1024)
    assert kinds["sgd"][2] == pytest.approx(1 / 1024)
