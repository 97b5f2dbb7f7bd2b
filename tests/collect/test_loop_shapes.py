"""Every loop shape, built (and some run) before the watch starts, on real MindSpore.

grad_norm is compared with a float64 numpy computation (rtol 1e-4): on the gradients the
loop itself produced where the loop can see them, else on an identical twin network
trained step by step in PyNative. These tests run on every MindSpore the package
supports (CI's version job runs them on 2.7.1 too).
"""

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import nn, ops
from mindspore.train import Model

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 20


def reference(steps, lr, seed=3):
    """Loss and grad norm of each step of a twin network trained in PyNative."""
    net = tiny.mlp(seed=seed)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    x, y = tiny.data()
    losses, norms = [], []
    for a, b in tiny.batches(x, y, steps=steps):
        loss, grads = grad_fn(a, b)
        losses.append(float(loss.asnumpy()))
        norms.append(tiny.numpy_global_norm(grads))
        opt(grads)
    return losses, norms


def check_run(mon, steps, norms, lr=None, first=0, losses=None):
    run = load_run(mon.run_dir)
    norm = run.scalars("train/grad_norm")
    assert norm.steps.tolist() == list(range(first, first + steps))
    np.testing.assert_allclose(norm.values, norms, rtol=1e-4)
    if lr is not None:
        np.testing.assert_allclose(run.scalars("train/learning_rate").values, lr, rtol=1e-6)
    if losses is not None:
        np.testing.assert_allclose(run.scalars("train/loss").values, losses, rtol=1e-4)
    assert mon.alerts == [], [a.message for a in mon.alerts]
    assert run.status == "finished"
    return run


def test_value_and_grad_with_optimizer(tmp_path):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    lr = tiny.warmup_lr(STEPS)
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    norms, losses = [], []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=STEPS):
            loss, grads = grad_fn(a, b)
            losses.append(float(loss.asnumpy()))
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
    run = check_run(mon, STEPS, norms, lr=lr, losses=losses)
    assert run.scalars("train/data_time").values.size == STEPS


def test_jit_step_compiled_before_the_watch(tmp_path):
    lr = tiny.warmup_lr(STEPS + 2)  # one entry per optimizer call
    ref_loss, ref_norm = reference(STEPS + 1, lr)
    net = tiny.mlp(seed=3)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=STEPS + 1))
    train_step(*batches[0])  # compiled and run before monitoring starts
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in batches[1:]:
            train_step(a, b)
    check_run(mon, STEPS, ref_norm[1:], lr=lr[1 : STEPS + 1], losses=ref_loss[1:])
    train_step(*batches[0])  # restored: it compiles again without the tap and runs


def test_jit_step_returning_its_norm_is_unchanged(tmp_path):
    net = tiny.mlp(seed=3)
    loss_fn = tiny.loss_fn()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss, ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))

    x, y = tiny.data()
    norms = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=8):
            norms.append(float(train_step(a, b)[1].asnumpy()))
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-5)
    np.testing.assert_allclose(run.scalars("train/learning_rate").values, 0.05, rtol=1e-6)


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's overflow check has Ascend and GPU kernels only: isfinite runs on CPU."""

    def get_overflow_status(self, status, compute_output):
        finite = ops.stack([ops.isfinite(g).all() for g in compute_output])
        return ops.logical_not(finite.all())


def train_cell(kind, lr):
    net = tiny.mlp(seed=3)
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    with_loss = nn.WithLossCell(net, tiny.loss_fn())
    if kind == "plain":
        return nn.TrainOneStepCell(with_loss, opt)
    if kind == "loss_scale":
        scale = nn.DynamicLossScaleUpdateCell(
            loss_scale_value=2**12, scale_factor=2, scale_window=1000
        )
        return CpuLossScaleCell(with_loss, opt, scale_sense=scale)

    class Step(nn.Cell):  # a user's own train cell
        def __init__(self):
            super().__init__()
            self.opt = opt
            self.grad_fn = ms.value_and_grad(with_loss, None, opt.parameters)

        def construct(self, a, b):
            loss, grads = self.grad_fn(a, b)
            self.opt(grads)
            return loss

    return Step()


def run_train_cell(tmp_path, kind):
    lr = tiny.warmup_lr(STEPS)
    ref_loss, ref_norm = reference(STEPS, lr)
    step = train_cell(kind, lr)  # built before the watch
    x, y = tiny.data()
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=STEPS):
            step(a, b)
    return check_run(mon, STEPS, ref_norm, lr=lr, losses=ref_loss)


def test_train_one_step_cell_by_hand(tmp_path):
    run = run_train_cell(tmp_path, "plain")
    data = run.scalars("train/data_time").values
    compute = run.scalars("train/compute_time").values
    assert np.median(data / (data + compute)) < 0.5  # the forward pass is compute


def test_loss_scale_cell_by_hand_records_unscaled_norm(tmp_path):
    run_train_cell(tmp_path, "loss_scale")


def test_users_own_train_cell(tmp_path):
    run_train_cell(tmp_path, "own")


def test_grad_with_hand_written_update(tmp_path):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    params = net.trainable_params()

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.grad(forward, None, params)
    norms = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=STEPS):
            grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            for p, g in zip(params, grads, strict=True):
                ops.assign(p, p - 0.1 * g)
    run = check_run(mon, STEPS, norms)
    assert run.scalars("train/loss").steps.tolist() == list(range(STEPS))


def dataset(batch=32, n=32 * 10):
    x, y = tiny.data(n=n)
    return mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch)


def model_reference(lr, epochs):
    net = tiny.mlp(seed=3)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    norms = []
    x, y = tiny.data(n=320)
    for _ in range(epochs):
        for i in range(0, len(y), 32):
            _, grads = grad_fn(ms.Tensor(x[i : i + 32]), ms.Tensor(y[i : i + 32]))
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
    return norms


def test_model_train_under_watch(tmp_path):
    lr = tiny.warmup_lr(20)
    ref_norm = model_reference(lr, epochs=2)
    net = tiny.mlp(seed=3)
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)  # built before the watch
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        model.train(2, dataset())
    check_run(mon, 20, ref_norm, lr=lr, first=1)


def test_repeated_model_train_continues_the_step_count(tmp_path):
    lr = tiny.warmup_lr(30)
    ref_norm = model_reference(lr, epochs=3)
    net = tiny.mlp(seed=3)
    opt = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    with Monitor(save_dir=str(tmp_path)) as mon:
        model.train(2, dataset(), callbacks=[mon.callback()])
        model.train(1, dataset(), callbacks=[mon.callback()])  # "train a bit more"
    run = check_run(mon, 30, ref_norm, lr=lr, first=1)
    assert run.scalars("train/loss").steps.tolist() == list(range(1, 31))
    assert mon.last_step == 30


def test_train_one_step_cell_in_graph_mode_compiled_before_the_watch(tmp_path):
    lr = tiny.warmup_lr(STEPS + 2)
    ref_loss, ref_norm = reference(STEPS + 1, lr)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        step = train_cell("plain", lr)
        x, y = tiny.data()
        batches = list(tiny.batches(x, y, steps=STEPS + 1))
        step(*batches[0])  # compiled and run before monitoring starts
        with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
            for a, b in batches[1:]:
                step(a, b)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    check_run(mon, STEPS, ref_norm[1:], lr=lr[1 : STEPS + 1], losses=ref_loss[1:])


def test_forward_calls_between_steps_are_not_steps(tmp_path):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    params = net.trainable_params()
    opt = nn.SGD(params, learning_rate=0.05)

    def forward(a, b):
        return loss_fn(net(a), b)

    value_and_grad = ms.value_and_grad(forward, None, params)
    grad = ms.grad(forward, None, params)
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=6):
            net(a)  # e.g. accuracy on the batch, before the step
            _, grads = value_and_grad(a, b)
            opt(grads)
            net(a)  # and after it
    assert mon.step_count == 6
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():  # no optimizer: grad calls
        for a, b in tiny.batches(x, y, steps=6):
            net(a)
            for p, g in zip(params, grad(a, b), strict=True):
                ops.assign(p, p - 0.05 * g)
    assert mon.step_count == 6
    assert load_run(mon.run_dir).scalars("train/grad_norm").steps.tolist() == list(range(6))


def test_jit_gradients_with_a_pynative_optimizer(tmp_path):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.jit(ms.value_and_grad(forward, None, opt.parameters))
    norms = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch() as watch:
        for a, b in tiny.batches(x, y, steps=8):
            _, grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)  # in Python: the watch sees its gradients, the tap stays idle
        assert watch.tap.optimizer.installed and watch.tap.optimizer.read_count() == 0
    check_run(mon, 8, norms, lr=[0.05] * 8)
