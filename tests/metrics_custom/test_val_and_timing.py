"""Validation metrics from Model.fit/Model.eval, custom scalars, and where step time goes."""

import time

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from msmon_nb.config import ConfigError
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny


def dataset(x, y, batch=32):
    return mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)


def test_fit_with_validation_records_val_metrics_at_epoch_ends(tmp_path):
    x, y = tiny.data(n=320)
    vx, vy = tiny.data(n=128, seed=4)
    net = tiny.mlp()
    model = Model(
        net,
        loss_fn=tiny.loss_fn(),
        optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9),
        metrics={"accuracy": nn.Accuracy()},
    )
    with Monitor(save_dir=str(tmp_path)) as mon:
        model.fit(3, dataset(x, y), dataset(vx, vy), callbacks=[mon.callback()])
        direct = model.eval(dataset(vx, vy))
    run = load_run(mon.run_dir)
    acc = run.scalars("val/accuracy")
    assert acc.steps.tolist() == [10, 20, 30]  # after each epoch of 10 steps
    assert np.all((acc.values >= 0) & (acc.values <= 1))
    assert acc.values[-1] == pytest.approx(direct["accuracy"], abs=1e-6)
    assert "val/loss" in run.tags()


def test_eval_under_watch_gets_the_callback(tmp_path):
    x, y = tiny.data(n=128)
    net = tiny.mlp()
    model = Model(
        net,
        loss_fn=tiny.loss_fn(),
        optimizer=nn.SGD(net.trainable_params(), 0.1),
        metrics={"acc": nn.Accuracy()},
    )
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        model.train(1, dataset(x, y))
        model.eval(dataset(x, y))
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist() == [1, 2, 3, 4]
    assert run.scalars("val/acc").steps.tolist() == [4]


def test_log_round_trip_and_bad_tags(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        for step in range(5):
            mon.step(loss=1.0)
            mon.log({"val/f1": 0.1 * step, "business/bleu": 20.0 + step})
        with pytest.raises(ConfigError, match="lowercase ASCII"):
            mon.log({"val/F1 score": 1.0})
        with pytest.raises(ConfigError, match="tag rule"):
            mon.step(loss=1.0, **{"bad tag@x": 1.0})
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("val/f1").values, [0.0, 0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    assert run.scalars("business/bleu").steps.tolist() == [0, 1, 2, 3, 4]


def slow_batches(x, y, steps, delay):
    for a, b in tiny.batches(x, y, steps=steps):
        time.sleep(delay)
        yield a, b


def test_data_time_measured_and_data_bound_flagged(tmp_path):
    x, y = tiny.data()
    # a few ms of compute per step, so waiting 50 ms dominates even where a loaded machine
    # (CI runs benches beside the tests) stretches the compute to 20 ms and more
    net = nn.Dense(8, 3)
    loss_fn = tiny.loss_fn()
    opt = nn.SGD(net.trainable_params(), 0.05)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    runs = {}
    for delay in (0.05, 0.0):
        with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
            for a, b in slow_batches(x, y, 30, delay):
                _, grads = grad_fn(a, b)
                opt(grads)
        runs[delay] = load_run(mon.run_dir)
    data = runs[0.05].scalars("train/data_time").values[1:]
    assert np.median(data) == pytest.approx(0.05, abs=0.01)
    assert np.median(runs[0.0].scalars("train/data_time").values[1:]) < 0.003
    compute = runs[0.05].scalars("train/compute_time").values[1:]
    step_time = runs[0.05].scalars("train/step_time").values[1:]
    # the two parts add up to the step: at nearly every step (a loaded machine stretches
    # the odd step between the parts: one in 29 was 26% off once in CI), and in the median
    parts = data + compute
    assert np.isclose(parts, step_time, rtol=0.25).mean() >= 0.9, (parts, step_time)
    assert np.median(parts / step_time) == pytest.approx(1.0, abs=0.1)
    bound = [a for a in runs[0.05].alerts if a["kind"] == "data_bound"]
    assert bound and "data-bound" in bound[0]["message"]
    assert [a for a in runs[0.0].alerts if a["kind"] == "data_bound"] == []
