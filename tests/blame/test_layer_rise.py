"""One layer rising alone, in real training: a tiny MLP trained with Momentum under
``mon.watch()`` over an ``ms.jit`` step, one parameter group's lr x100 from step AT. The
global norm hardly moves; ``layer_rise`` names that group's weight within two steps, from
its update ratio read off the Parameters. The unbroken twin raises nothing, and the
monitored weights are bit-identical to an unmonitored run's."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn

from msmon_nb.monitor import Monitor
from msmon_nb.monitor.layers import UpdateRatios
from tests.support import tiny

AT = 80
STEPS = 120


def train(tmp_path, factor: float, monitored: bool = True):
    x, y = tiny.data()
    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 16), nn.ReLU(), nn.Dense(16, 3)]
    )
    params = net.trainable_params()
    target = params[2]  # the middle Dense's weight
    lr = 0.02
    mine = [lr if s < AT else lr * factor for s in range(STEPS)]
    groups = [
        {"params": params[:2], "lr": [lr] * STEPS},
        {"params": [target], "lr": mine},
        {"params": params[3:], "lr": [lr] * STEPS},
    ]
    opt = nn.Momentum(groups, learning_rate=[lr] * STEPS, momentum=0.9)
    forward = nn.WithLossCell(net, tiny.loss_fn())
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    losses = []
    mon = (
        Monitor(save_dir=str(tmp_path), blame={"detail_steps": 0, "update_ratio": True})
        if monitored
        else None
    )
    if mon is not None:
        with mon, mon.watch():
            for a, b in tiny.batches(x, y, steps=STEPS):
                losses.append(float(step(a, b).asnumpy()))
    else:
        for a, b in tiny.batches(x, y, steps=STEPS):
            losses.append(float(step(a, b).asnumpy()))
    weights = [p.asnumpy().copy() for p in opt.parameters]
    return mon, target.name, losses, weights


def test_a_one_group_lr_jump_is_named_from_its_update_ratio(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mon, target, _, _ = train(tmp_path / "broken", 100.0)
    rises = [a for a in mon.alerts if a.kind == "layer_rise"]
    assert rises, [a.message for a in mon.alerts]
    first = rises[0]
    assert first.blame[0]["name"] == target, first.message
    assert first.since_step >= AT and first.step <= AT + 2, first.message
    assert "update_ratio" in first.message
    # before it, no alert named any layer or the gradient
    assert not [a for a in mon.alerts if a.step < AT and a.kind != "loss_plateau"]
    lines = (mon.run_dir / "alerts.jsonl").read_text()
    assert '"layer_rise"' in lines and target in lines


def test_the_unbroken_twin_is_quiet_and_training_is_untouched(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mon, _, losses, weights = train(tmp_path / "healthy", 1.0)
    assert not [a for a in mon.alerts if a.kind == "layer_rise"], [a.message for a in mon.alerts]
    _, _, plain_losses, plain_weights = train(tmp_path / "plain", 1.0, monitored=False)
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, plain_weights, strict=True))


def train_model(tmp_path, held: bool):
    """The same failure in ``Model.train`` (GRAPH_MODE), whose fast steps' scalars and
    per-layer judgements are held and run in batches (``Monitor.hold_emits``), or, with
    ``held`` False, passed on one step at a time."""
    import mindspore.dataset as mds
    from mindspore.train import Model

    x, y = tiny.data(n=32 * STEPS)
    ms.set_seed(0)
    net = nn.SequentialCell(
        [nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 16), nn.ReLU(), nn.Dense(16, 3)]
    )
    params = net.trainable_params()
    target = params[2]
    lr = 0.02
    groups = [
        {"params": params[:2], "lr": [lr] * STEPS},
        {"params": [target], "lr": [lr if s < AT else lr * 100 for s in range(STEPS)]},
        {"params": params[3:], "lr": [lr] * STEPS},
    ]
    opt = nn.Momentum(groups, learning_rate=[lr] * STEPS, momentum=0.9)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    mon = Monitor(save_dir=str(tmp_path), blame={"detail_steps": 0, "update_ratio": True})
    batches: list[int] = []
    passing_on = mon.outlet._pass_on  # (reached in: how many steps each batch held)
    mon.outlet._pass_on = lambda items: (batches.append(len(items)), passing_on(items))[1]
    if not held:
        mon.hold_emits = lambda on: Monitor.hold_emits(mon, False)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with mon:
            model.train(1, data, callbacks=[mon.callback()], dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    # the per-layer alerts and those naming layers (a rule on wall times could differ
    # between two runs on a loaded machine; these are of the values, which do not)
    alerts = [
        (a.kind, a.step, a.since_step, [b["name"] for b in a.blame])
        for a in mon.alerts
        if a.kind == "layer_rise" or a.blame
    ]
    return target.name, alerts, batches


def test_held_steps_are_judged_per_layer_as_one_at_a_time(tmp_path, monkeypatch):
    """Held, the per-layer judgement of a batch of steps runs together when their
    scalars are passed on (its code stays in the caches), before the rules see them:
    the alerts, their steps and what they name are those of the steps judged one by
    one, and the broken group's weight is named first. (Steps are held when they come
    closer than ``outlet.GAP``: on a loaded machine this tiny model's steps may not, so
    the held arm widens it and the batches' age, to be held whatever the load.)"""
    from msmon_nb.monitor import outlet

    with monkeypatch.context() as patched:
        patched.setattr(outlet, "GAP", 60.0)
        patched.setattr(outlet, "MAX_AGE", 0.5)
        target, held, batches = train_model(tmp_path / "held", held=True)
    _, single, singles = train_model(tmp_path / "single", held=False)
    assert max(batches) > 1 and max(singles) == 1, (batches, singles)
    assert held == single
    _, step, since, named = next(a for a in held if a[0] == "layer_rise")
    assert named[0] == target and since >= AT and step <= AT + 2, held


def test_update_ratios_are_the_parameters_own_update():
    """The ratio of a real optimizer step, against float64 numpy over the same weights;
    a weight written between two steps shows in the next ratio."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = tiny.mlp()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = tiny.loss_fn()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    names = tuple(p.name for p in opt.parameters)
    ratios = UpdateRatios(512)
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=3))
    assert np.isnan(ratios.measure(names, list(opt.parameters))).all()  # no w_prev yet
    before = [p.asnumpy().astype(np.float64) for p in opt.parameters]
    _, grads = grad_fn(*batches[0])
    opt(grads)
    got = ratios.measure(names, list(opt.parameters))
    after = [p.asnumpy().astype(np.float64) for p in opt.parameters]
    want = [
        math.sqrt(((w1 - w0) ** 2).sum()) / math.sqrt((w0**2).sum())
        for w0, w1 in zip(before, after, strict=True)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    first = opt.parameters[0]
    first.set_data(ms.Tensor(first.asnumpy() * 3.0))  # written between two steps
    got = ratios.measure(names, list(opt.parameters))
    assert got[0] == np.float64(got[0]) and abs(got[0] - 2.0) < 1e-5  # ||3w - w|| / ||w||
    assert np.allclose(got[1:], 0.0)


def test_past_the_memory_limit_a_parameter_is_not_measured_and_said_once():
    said = []
    ratios = UpdateRatios(1, lambda key, message: said.append(message))
    small = np.ones(16, np.float32)
    big = np.ones(300_000, np.float32)  # 1.2 MB

    class P:
        def __init__(self, name, value):
            self.name, self.value = name, value

        def asnumpy(self):
            return self.value

    params = [P("a", small), P("b", big)]
    for _ in range(2):
        got = ratios.measure(("a", "b"), params)
    assert got[0] == 0.0 and np.isnan(got[1])
    assert said and "blame.ratio_mb=1" in said[0] and "b" in said[0]
