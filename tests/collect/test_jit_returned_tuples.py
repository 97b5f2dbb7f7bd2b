"""A jit step that returns other tensors beside its gradients: which tuple is the
gradients is decided by the Parameters of the optimizer the step's function refers to.

A micro-batch step of host accumulation (MindYOLO's shape) that also returns its logits
for a metric, first: ``(loss, (logits,), grads)``. Its function refers to the optimizer
(it differentiates over ``opt.parameters``), so the tuple whose shapes are those
Parameters' is its gradients; the logits are never taken for them, whatever their place.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

MICRO = 2
STEPS = 6


def _norm(grads) -> float:
    return math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))


def test_logits_returned_before_the_gradients_are_not_taken_for_them(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = tiny.mlp(seed=5)
    opt = nn.SGD(net.trainable_params(), 0.05)
    loss_fn = tiny.loss_fn()

    def forward(x, y):
        logits = net(x)
        return loss_fn(logits, y), logits

    @ms.jit
    def micro_step(x, y):
        grad_fn = ms.value_and_grad(forward, None, opt.parameters, has_aux=True)
        (loss, logits), grads = grad_fn(x, y)
        return loss, (logits,), grads

    x, y = tiny.data()
    pairs = list(tiny.batches(x, y, steps=STEPS * MICRO))
    largest, applied = [], []
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for s in range(STEPS):
            total, norms = None, []
            for a, b in pairs[s * MICRO : (s + 1) * MICRO]:
                _, _, grads = micro_step(a, b)
                norms.append(_norm(grads))
                pairs_ = zip(total or grads, grads, strict=True)
                total = grads if total is None else [g + h for g, h in pairs_]
            mean = tuple(g / MICRO for g in total)
            applied.append(_norm(mean))
            largest.append(max(norms))
            opt(mean)
    run = load_run(mon.run_dir)
    tags = list(run.tags())
    assert "train/micro_grad_norm" in tags, tags
    micro = run.scalars("train/micro_grad_norm").values.tolist()
    assert len(micro) == STEPS
    for got, want in zip(micro, largest, strict=True):
        assert math.isclose(got, want, rel_tol=1e-4), (micro, largest)
    norms = run.scalars("train/grad_norm").values.tolist()
    for got, want in zip(norms, applied, strict=True):
        assert math.isclose(got, want, rel_tol=1e-4), (norms, applied)
