"""``param_stat_kinds``: max |x|, non-finite count and zero share of weights, gradients and
optimizer moments beside their norm, on a watched PyNative loop (Adam).

The reference is an unmonitored twin trained on the same batches, its statistics taken
in float64 numpy at the same points (the step's gradients, the weights and moments after
its update). Summary files hold float32 scalars: values are compared at that precision
(rtol 1e-6), counts and shares exactly. The default (``norm`` alone) records nothing new.
"""

import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.collect.optstate import PATH_ENV
from msmon_nb.collect.values import param_tag
from msmon_nb.config import CORE_METRICS
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny
from tests.support.extent64 import stats64

STEPS, EVERY = 7, 3
KINDS = ["norm", "max_abs", "nonfinite", "zero_frac"]
TRACK = [*CORE_METRICS, "param_stats", "optimizer_state"]


def build():
    net = tiny.mlp()
    # a dead hidden unit: its weights' row, its bias and their gradients are zeros, so the
    # zero shares are not all 0
    w = net[0].weight.asnumpy()
    w[3] = 0.0
    net[0].weight.set_data(ms.Tensor(w))
    b = net[0].bias.asnumpy()
    b[3] = -50.0
    net[0].bias.set_data(ms.Tensor(b))
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_fn = tiny.loss_fn()
    grad_fn = ms.value_and_grad(lambda a, c: loss_fn(net(a), c), None, opt.parameters)
    return net, opt, grad_fn


def state(opt):
    """The optimizer's weights and moments, copied to numpy."""
    return [t.asnumpy().copy() for t in (*opt.parameters, *opt.moment1, *opt.moment2)]


def twin():
    """The unmonitored reference: (expected values by step, the final state). Only numpy
    leaves this function: a second live optimizer in the test's frame would make the
    watch take the loop for one stepping two optimizers in turn (collect.parts)."""
    _, opt, expected = train()
    return expected, state(opt)


def train(mon=None):
    net, opt, grad_fn = build()
    x, y = tiny.data()
    expected = {}
    for step, (a, c) in enumerate(tiny.batches(x, y, steps=STEPS)):
        _, grads = grad_fn(a, c)
        opt(grads)
        if mon is None and step % EVERY == 0:
            want = {}
            for p, g, m1, m2 in zip(opt.parameters, grads, opt.moment1, opt.moment2, strict=True):
                for what, t in (("weight", p), ("grad", g), ("moment1", m1), ("moment2", m2)):
                    for kind, v in stats64(t.asnumpy()).items():
                        if kind not in KINDS:  # (param_stat_kinds has no mean)
                            continue
                        want[f"param/{param_tag(p.name)}/{what}_{kind}"] = v
            expected[step] = want
    return net, opt, expected


def recorded(run):
    pattern = r"param/.+/(weight|grad|moment1|moment2)_(norm|max_abs|nonfinite|zero_frac)"
    return {tag: run.scalars(tag) for tag in run.tags() if re.fullmatch(pattern, tag)}


@pytest.mark.parametrize("path", ["host", "device"])
def test_every_kind_exact_and_training_unchanged(tmp_path, monkeypatch, path):
    monkeypatch.setenv(PATH_ENV, path)  # the moments' reduction: numpy or a compiled graph
    expected, final = twin()
    cfg = dict(
        save_dir=str(tmp_path),
        log_interval=EVERY,
        track_metrics=TRACK,
        param_stat_kinds=KINDS,
    )
    with Monitor(**cfg) as mon, mon.watch():
        net, opt, _ = train(mon)
    for want, got in zip(final, state(opt), strict=True):  # bit-identical training
        np.testing.assert_array_equal(got, want)
    series = recorded(load_run(mon.run_dir))
    assert set(series) == set(expected[0])  # 4 parameters x 4 tensors x 4 kinds
    assert len(series) == 64
    steps = sorted(expected)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = [expected[step][tag] for step in steps]
        if tag.endswith(("nonfinite", "zero_frac")):
            np.testing.assert_array_equal(s.values, np.float32(want), err_msg=tag)
        else:
            # float32 graph reductions for the moments on the device path
            rtol = 1e-5 if "moment" in tag and path == "device" else 1e-6
            np.testing.assert_allclose(s.values, want, rtol=rtol, err_msg=tag)
    dead = param_tag(net[0].weight.name)  # the dead unit's row stays zero: Adam moves it by 0
    assert all(series[f"param/{dead}/weight_zero_frac"].values == np.float32(1 / 16))
    assert all(series[f"param/{dead}/grad_zero_frac"].values >= np.float32(1 / 16))


def test_default_records_the_norm_alone(tmp_path):
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=TRACK)
    with Monitor(**cfg) as mon, mon.watch():
        train(mon)
    tags = set(recorded(load_run(mon.run_dir)))
    assert tags and all(t.endswith("_norm") for t in tags)
