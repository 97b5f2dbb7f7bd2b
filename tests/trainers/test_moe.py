"""``moe``: a router's entropy and load (``moe/<router>/router_entropy``,
``tokens_per_expert_max_frac``, ``moe_load/<router>.expert_<i>/share``) on collected
PyNative steps, for MindFormers 2.1.0's own ``Router`` (``TopkRouterV1``) found by
structure in a tiny mixture-of-experts model (``tests/support/tinymoe.py``).

The reference is an unmonitored twin trained on the same batches: before each step, the
router's logits recomputed in float64 from its weights (embed, ReLU, the gate's Dense),
their softmax entropy and top-2 counts taken here in numpy. Training is bit-identical.
"""

from __future__ import annotations

import math
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.config import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tinymoe

STEPS, EVERY = 8, 2


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mindformers"))
    try:
        tinymoe.import_router(path)
    except ImportError as exc:  # the Makefile installs it; say what is missing
        pytest.fail(f"MindFormers 2.1.0 is not importable from {tinymoe.MINDFORMERS_DIR}: {exc}")
    return path


def expected(net, x):
    """(entropy, shares) of the router's choice for batch ``x``, float64 numpy."""
    we, be = (p.asnumpy().astype(np.float64) for p in (net.embed.weight, net.embed.bias))
    wg = net.router.dense.weight.asnumpy().astype(np.float64)
    h = np.maximum(x.asnumpy().astype(np.float64) @ we.T + be, 0.0)
    logits = h @ wg.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    entropy = float(np.mean(-(p * np.log(p)).sum(1)))
    top = np.argsort(-p, axis=1)[:, : tinymoe.TOPK]
    shares = np.array([(top == e).sum() for e in range(tinymoe.EXPERTS)]) / top.size
    return entropy, shares


def run_loop(log_dir, mon=None):
    """The loop itself (kept apart so the twin and the watched run share it)."""
    ms.set_seed(0)
    net = tinymoe.TinyMoE(log_dir)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    want = {}
    for step, (x, y) in enumerate(tinymoe.batches(STEPS)):
        if mon is None and step % EVERY == 0:
            want[step] = expected(net, x)
        _, grads = grad_fn(x, y)
        opt(grads)
    return net, opt, want


def twin(log_dir):
    """Numpy only leaves: a live twin optimizer could be taken for the loop's."""
    _, opt, want = run_loop(log_dir)
    return [p.asnumpy().copy() for p in (*opt.parameters, *opt.moment1, *opt.moment2)], want


def test_router_entropy_and_load_exact_and_training_unchanged(tmp_path, log_dir):
    final, want = twin(log_dir)
    config = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=["loss", "moe"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**config) as mon, mon.watch():
            _, opt, _ = run_loop(log_dir, mon)
    assert not [w for w in caught if issubclass(w.category, MonitorWarning)]
    state = [p.asnumpy() for p in (*opt.parameters, *opt.moment1, *opt.moment2)]
    for got, ref in zip(state, final, strict=True):
        np.testing.assert_array_equal(got, ref)
    run = load_run(mon.run_dir)
    steps = sorted(want)
    entropy = run.scalars("moe/router/router_entropy")
    top = run.scalars("moe/router/tokens_per_expert_max_frac")
    assert entropy.steps.tolist() == steps and top.steps.tolist() == steps
    np.testing.assert_allclose(entropy.values, [want[s][0] for s in steps], rtol=1e-5)
    np.testing.assert_allclose(top.values, [want[s][1].max() for s in steps], rtol=1e-6)
    for e in range(tinymoe.EXPERTS):
        share = run.scalars(f"moe_load/router.expert_{e}/share")
        np.testing.assert_allclose(share.values, [want[s][1][e] for s in steps], rtol=1e-6)
    # the router learns: not indifferent (log 4) and not the same at every step
    assert max(entropy.values) < math.log(tinymoe.EXPERTS)
    assert len(set(entropy.values.tolist())) == len(steps)


def test_no_router_warns_once(tmp_path):
    from tests.support import tiny

    net = tiny.mlp()
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    loss_fn = tiny.loss_fn()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x, y = tiny.data()
    cfg = dict(save_dir=str(tmp_path), track_metrics=["loss", "moe"])
    warns = pytest.warns(MonitorWarning, match="holds no router")
    with warns as caught, Monitor(**cfg) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=4):
            _, grads = grad_fn(a, b)
            opt(grads)
    assert sum("no router" in str(w.message) for w in caught) == 1
    assert not [t for t in load_run(mon.run_dir).tags if t.startswith("moe")]
