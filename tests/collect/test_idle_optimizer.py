"""An optimizer that never steps, beside the one the loop calls (a twin kept for
comparison, an earlier cell's, a teacher's): the watch holds the loop's first parts until
it knows whether the loop steps several optimizers (``collect.parts``), and those held
parts are recorded by their own step's collect decision, so ``log_interval`` holds from
the first step. On d09e896 the first 32 steps were all recorded whatever the interval."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS, EVERY = 12, 3


def train_pair(seed: int):
    net = tiny.mlp(seed=seed)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = tiny.loss_fn()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    return opt, grad_fn


def test_log_interval_holds_from_the_first_step_with_an_idle_optimizer_in_scope(tmp_path):
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=STEPS))
    opt, grad_fn = train_pair(seed=3)
    idle_opt, _ = train_pair(seed=4)  # in the loop's namespace, never called
    losses = []
    with Monitor(save_dir=str(tmp_path), log_interval=EVERY) as mon, mon.watch():
        for a, b in batches:
            loss, grads = grad_fn(a, b)
            opt(grads)
            losses.append(float(loss.asnumpy()))
    assert idle_opt is not opt
    run = load_run(mon.run_dir)
    loss = run.scalars("train/loss")
    assert loss.steps.tolist() == list(range(0, STEPS, EVERY))
    np.testing.assert_allclose(loss.values, losses[::EVERY], rtol=1e-6)
    assert run.scalars("train/grad_norm").steps.tolist() == list(range(0, STEPS, EVERY))
    assert mon.last_step == STEPS - 1
