"""``stable_rank``: ``param/<name>/sigma_max`` and ``param/<name>/stable_rank`` of the
selected weight matrices, every ``stable_rank_every``-th collected step, in a PyNative
loop, an ``@ms.jit`` step, a GRAPH_MODE train cell and ``Model.train``.

The reference is an unmonitored twin trained the same way on the same batches: after
each step its weights are copied and decomposed by numpy's SVD in float64. The recorded
values are float32 scalars, computed by warm-started Lanczos with float32 products:
compared at rtol 2e-6. Training is bit-identical, weights and Adam's moments.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from msmon_nb.collect.values import param_tag
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor

STEPS, EVERY, SR_EVERY = 24, 2, 2
MATRICES = ("0.weight", "2.weight", "4.weight")  # 48x12, 48x48, 4x48


def batches():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(STEPS * 16, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=STEPS * 16).astype(np.int32)
    return [(ms.Tensor(x[i : i + 16]), ms.Tensor(y[i : i + 16])) for i in range(0, len(x), 16)]


def build():
    ms.set_seed(5)
    net = nn.SequentialCell(
        [nn.Dense(12, 48), nn.ReLU(), nn.Dense(48, 48), nn.ReLU(), nn.Dense(48, 4)]
    )
    opt = nn.Adam(net.trainable_params(), learning_rate=2e-2)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    return net, opt, loss


def spectra(params):
    """name -> (sigma_max, stable rank) of each 2-D parameter, by float64 SVD."""
    out = {}
    for p in params:
        w = p.asnumpy().astype(np.float64)
        if w.ndim == 2:
            s = np.linalg.svd(w, compute_uv=False)
            out[p.name] = (float(s[0]), float((s * s).sum() / s[0] ** 2))
    return out


class After(ms.train.Callback):
    """The twin's spectra after each ``Model.train`` step (the reference only)."""

    def __init__(self, params):
        super().__init__()
        self.params, self.seen = params, {}

    def on_train_step_end(self, run_context):
        step = int(run_context.original_args().cur_step_num)
        self.seen[step] = spectra(self.params)


def train(way, mon=None):
    """Train one way; returns (net, opt, {step: spectra}) (spectra only without ``mon``)."""
    net, opt, loss = build()
    seen = {}
    if way in ("pynative", "jit"):
        grad_fn = ms.value_and_grad(loss, None, opt.parameters)

        def step(x, y):
            value, grads = grad_fn(x, y)
            opt(grads)
            return value

        step = ms.jit(step) if way == "jit" else step
        for i, (x, y) in enumerate(batches()):
            step(x, y)
            if mon is None:
                seen[i] = spectra(opt.parameters)
        return net, opt, seen
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        cell = nn.TrainOneStepCell(loss, opt)
        if way == "cell":
            for i, (x, y) in enumerate(batches()):
                cell(x, y)
                if mon is None:
                    seen[i] = spectra(opt.parameters)
            return net, opt, seen
        data = ms.dataset.GeneratorDataset(
            [(x.asnumpy(), y.asnumpy()) for x, y in batches()], ["x", "y"], shuffle=False
        )
        after = After(opt.parameters)
        callbacks = [mon.callback()] if mon is not None else [after]
        Model(cell).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        return net, opt, after.seen
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def state(opt):
    return [t.asnumpy().copy() for t in (*opt.parameters, *opt.moment1, *opt.moment2)]


def twin(way):
    """The unmonitored reference: (final state, {step: spectra}). Only numpy leaves this
    function: a second live optimizer in the test's frame would be one the watch could
    take for the loop's."""
    _, opt, expected = train(way)
    return state(opt), expected


@pytest.mark.parametrize("way", ["pynative", "jit", "cell", "model"])
def test_exact_against_svd_and_training_unchanged(tmp_path, way):
    twin_state, expected = twin(way)
    config = dict(
        save_dir=str(tmp_path),
        log_interval=EVERY,
        track_metrics=["loss", "grad_norm", "stable_rank"],
        stable_rank_every=SR_EVERY,
        # blame off: the graph ways hand the parameters over for stable_rank alone
        blame={"enabled": False},
    )
    with Monitor(**config) as mon:
        if way == "model":
            _, opt, _ = train(way, mon)
        else:
            with mon.watch():
                _, opt, _ = train(way, mon)
    for got, want in zip(state(opt), twin_state, strict=True):  # bit-identical training
        np.testing.assert_array_equal(got, want)
    run = load_run(mon.run_dir)
    first = 1 if way == "model" else 0  # Model.train counts from 1
    collected = [s for s in range(first, first + STEPS) if s % EVERY == 0]
    due = collected[::SR_EVERY]  # the first collected step, then every SR_EVERY-th
    assert len(due) == 6
    for name in MATRICES:
        sigma = run.scalars(f"param/{param_tag(name)}/sigma_max")
        rank = run.scalars(f"param/{param_tag(name)}/stable_rank")
        assert sigma.steps.tolist() == due, (name, sigma.steps)
        assert rank.steps.tolist() == due, name
        want = np.array([expected[s][name] for s in due])
        np.testing.assert_allclose(sigma.values, want[:, 0], rtol=2e-6, err_msg=name)
        np.testing.assert_allclose(rank.values, want[:, 1], rtol=2e-6, err_msg=name)
    # biases (1-D) are not matrices
    assert not [t for t in run.tags if t.endswith("bias/sigma_max")]


def test_targets_select_and_every_counts_collected_steps(tmp_path):
    config = dict(
        save_dir=str(tmp_path),
        log_interval=3,
        track_metrics=["loss", "stable_rank"],
        stable_rank_every=4,
        stable_rank_targets=[r"^2\."],
    )
    with Monitor(**config) as mon, mon.watch():
        train("pynative", mon)
    run = load_run(mon.run_dir)
    tags = sorted(t for t in run.tags if t.startswith("param/"))
    assert tags == ["param/2.weight/sigma_max", "param/2.weight/stable_rank"]
    # collected: 0, 3, ..., 21 (8 steps); every 4th of them: 0 and 12
    assert run.scalars("param/2.weight/sigma_max").steps.tolist() == [0, 12]


def test_off_by_default(tmp_path):
    with Monitor(save_dir=str(tmp_path), log_interval=EVERY) as mon, mon.watch():
        train("pynative", mon)
    assert not [t for t in load_run(mon.run_dir).tags if t.startswith("param/")]


def test_explicit_step_without_params_warns_once(tmp_path):
    from msmon_nb.config import MonitorWarning

    warns = pytest.warns(MonitorWarning, match="params=net.trainable_params")
    with (
        warns as caught,
        Monitor(save_dir=str(tmp_path), track_metrics=["loss", "stable_rank"]) as mon,
    ):
        for i in range(3):
            mon.step(loss=1.0 / (i + 1))
    assert sum("stable_rank" in str(w.message) for w in caught) == 1
    assert math.isfinite(load_run(mon.run_dir).scalars("train/loss").values[-1])
