"""mon.watch(): unchanged functional loops, including objects made before the watch."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.collect.graph import global_norm
from msmon_nb.collect.watch import WatchError
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny


def make_loop(lr=0.05, steps=30):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    return x, y, net, opt, grad_fn


def test_unchanged_loop_records_loss_gradnorm_lr(tmp_path):
    x, y, _net, opt, grad_fn = make_loop(lr=tiny.warmup_lr(25))  # built before the watch
    seen_loss, seen_norm = [], []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=25):
            loss, grads = grad_fn(a, b)
            seen_loss.append(float(loss.asnumpy()))
            seen_norm.append(tiny.numpy_global_norm(grads))
            opt(grads)
    run = load_run(mon.run_dir)
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == list(range(25))
    np.testing.assert_allclose(loss.values, seen_loss, rtol=1e-6)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, seen_norm, rtol=1e-4)
    lr = run.scalars("train/learning_rate").values
    np.testing.assert_allclose(lr, tiny.warmup_lr(25), rtol=1e-6)  # warmup visible step by step
    assert run.scalars("train/throughput").values.min() > 0
    assert run.scalars("train/global_step").values.tolist() == list(range(25))
    assert run.status == "finished"


def hooked_now():
    """What every way in this MindSpore attaches to holds right now."""
    from msmon_nb.collect.hooks import find_ways_in, original

    return {t.path: original(t) for way in find_ways_in().values() for t in way.targets}


def test_patches_restored_even_after_exception(tmp_path):
    before = hooked_now()
    x, y, _net, opt, grad_fn = make_loop()
    with pytest.raises(ZeroDivisionError), Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=10)):
            _, grads = grad_fn(a, b)
            opt(grads)
            if i == 4:
                raise ZeroDivisionError("user bug")
    assert hooked_now() == before
    assert "__call__" not in vars(nn.Optimizer)
    assert load_run(mon.run_dir).status == "interrupted"
    assert load_run(mon.run_dir).scalars("train/loss").steps.tolist() == [0, 1, 2, 3, 4]


def test_collect_freq_change_mid_run(tmp_path):
    x, y, _net, opt, grad_fn = make_loop()
    with Monitor(save_dir=str(tmp_path), log_interval=2) as mon, mon.watch():
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=30)):
            _, grads = grad_fn(a, b)
            opt(grads)
            if i == 11:
                mon.set_collect_freq(5)
    steps = load_run(mon.run_dir).scalars("train/loss").steps.tolist()
    assert steps == [0, 2, 4, 6, 8, 10, 15, 20, 25]


def test_grad_without_value_and_grad(tmp_path):
    x, y, net, opt, _ = make_loop()
    loss_fn = tiny.loss_fn()
    grad_fn = ms.grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    norms = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=6):
            grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-4)
    assert len(run.scalars("train/loss").steps) == 6  # the forward output is the loss


def test_jit_step_records_loss_and_returned_global_norm(tmp_path):
    x, y, _net, opt, grad_fn = make_loop()

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss, global_norm(grads)

    losses, norms = [], []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=8):
            loss, norm = train_step(a, b)
            losses.append(float(loss.asnumpy()))
            norms.append(float(norm.asnumpy()))
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist() == list(range(8))
    np.testing.assert_allclose(run.scalars("train/loss").values, losses, rtol=1e-6)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-6)


def test_graph_safe_global_norm_matches_numpy():
    x, y, _net, _opt, grad_fn = make_loop()
    a, b = next(tiny.batches(x, y, steps=1))
    _, grads = grad_fn(a, b)
    assert float(global_norm(grads).asnumpy()) == pytest.approx(
        tiny.numpy_global_norm(grads), rel=1e-5
    )


def test_stop_ends_loop_at_step_boundary(tmp_path):
    x, y, _net, opt, grad_fn = make_loop()
    done = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=50)):
            _, grads = grad_fn(a, b)
            opt(grads)
            done.append(i)
            if i == 6:
                mon.stop()
    assert done == list(range(7))
    run = load_run(mon.run_dir)
    assert run.status == "stopped"
    assert run.scalars("train/loss").steps.tolist() == list(range(7))


def test_one_watch_at_a_time(tmp_path):
    with (
        Monitor(save_dir=str(tmp_path)) as a,
        a.watch(),
        Monitor(save_dir=str(tmp_path)) as b,
        pytest.raises(WatchError, match="already watching"),
        b.watch(),
    ):
        pass
