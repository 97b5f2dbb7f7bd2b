"""The activation rules on real recorded series: a tiny MindSpore network trained on the
CPU under a real ``Monitor`` with ``track_metrics: [..., activations]`` (PyNative hooks,
``act/<module>/<stat>`` in forward order), a fault written by the loop at a known step,
and the alerts the monitor raised live, compared with a replay of the run's series.

The network's forward order (``inp``, ``mid``, ``deep``, ``head``) is neither the order its
modules are defined in nor their alphabetical order, so a rule (or a replay) that ordered
modules either way would name the wrong one.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from bench.actrules import diverged
from msmon_nb.diagnose import diagnose
from msmon_nb.monitor import Monitor

FAULT = 40
ACT_KINDS = {"nonfinite_origin", "output_logit_divergence", "activation_blowup", "activation_dying"}
ORDER = ["inp", "mid", "deep", "head"]


class Net(nn.Cell):
    """Four Dense layers; ``relu``: each hidden layer is ``Dense(..., activation="relu")``
    (its output is the ReLU's), else a tanh follows it outside the module (so a NaN
    stays a NaN: this CPU backend's ReLU maps NaN to 0)."""

    def __init__(self, relu: bool) -> None:
        super().__init__()
        act = "relu" if relu else None
        self.head = nn.Dense(16, 3)
        self.deep = nn.Dense(16, 16, activation=act)
        self.mid = nn.Dense(16, 16, activation=act)
        self.inp = nn.Dense(8, 16, activation=act)
        self.relu = relu

    def construct(self, x):
        h = self.inp(x)
        h = h if self.relu else ops.tanh(h)
        h = self.mid(h)
        h = h if self.relu else ops.tanh(h)
        h = self.deep(h)
        h = h if self.relu else ops.tanh(h)
        return self.head(h)


def train(tmp_path, fault=None, relu=True, steps=70, out_lr=None, seed=0):
    """Train on a 3-class toy problem with Adam under a Monitor (every step collected);
    ``fault(net, step)`` runs before each step's forward pass; ``out_lr(step)``: the output
    layer's lr (its own optimizer). Returns (the monitor, its alerts)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(seed)
    net = Net(relu)
    rng = np.random.default_rng(seed)
    proj = rng.normal(size=(8, 3)).astype(np.float32)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    head = [p for p in net.trainable_params() if p.name.startswith("head.")]
    body = [p for p in net.trainable_params() if not p.name.startswith("head.")]
    opt = nn.Adam(body if out_lr else net.trainable_params(), learning_rate=1e-2)
    opt_out = nn.Adam(head, learning_rate=out_lr) if out_lr else None
    params = opt.parameters + (opt_out.parameters if opt_out else ())
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, params)
    cfg = dict(
        save_dir=str(tmp_path),
        run_name="acts",
        log_interval=1,
        track_metrics=["loss", "grad_norm", "learning_rate", "activations"],
        # a Dense with an activation holds a sub-cell, so the default selection (leaf
        # modules with parameters) skips it: named, its output is the ReLU's
        module_targets=["^(inp|mid|deep|head)$"],
    )
    with Monitor(**cfg) as mon, mon.watch():
        for step in range(steps):
            x = rng.normal(size=(32, 8)).astype(np.float32)
            y = np.argmax(x @ proj, axis=1).astype(np.int32)
            if fault is not None:
                fault(net, step)
            _loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
            if opt_out is None:
                opt(grads)
            else:
                opt(grads[: len(body)])
                opt_out(grads[len(body) :])
    return mon, [dict(a.to_dict()) for a in mon.alerts if a["kind"] in ACT_KINDS]


def replayed(mon):
    return [a.to_dict() for a in diagnose(mon.series) if a.kind in ACT_KINDS]


def shift_bias(name, by):
    def fault(net, step):
        if step == FAULT:
            bias = getattr(net, name).bias
            bias.set_data(ms.Tensor(bias.asnumpy() - np.float32(by)))

    return fault


def nan_weight(name):
    def fault(net, step):
        if step == FAULT:
            weight = getattr(net, name).weight
            w = weight.asnumpy().copy()
            w[0, 0] = np.nan
            weight.set_data(ms.Tensor(w))

    return fault


def test_nonfinite_origin_names_the_first_module_whose_output_is_not_finite(tmp_path):
    """A NaN written into mid's weight: mid, deep and head turn non-finite at the same step;
    the origin is mid (inp, before it, is finite), at that step."""
    mon, found = train(tmp_path, nan_weight("mid"), relu=False, steps=FAULT + 5)
    assert [a["kind"] for a in found] == ["nonfinite_origin"], found
    alert = found[0]
    assert alert["step"] == alert["since_step"] == FAULT
    assert alert["tag"] == "act/mid/nonfinite" and alert["severity"] == "critical"
    assert [b["name"] for b in alert["blame"]] == ["mid", "deep", "head"]
    assert "mid's output at step 40" in alert["message"]
    assert "the 1 module(s) before it were finite" in alert["message"]
    assert alert["value"] == 32.0  # one input unit's weight: 32 rows x that output unit
    assert replayed(mon) == found
    # the step-level nonfinite rule sees it too, but only as "the loss is NaN"
    assert any(a["kind"] == "nonfinite" and a["step"] == FAULT for a in mon.alerts)


def test_dying_names_the_layer_whose_units_died_at_the_step_they_did(tmp_path):
    """mid's biases written 5 lower (a bad update): every mid unit outputs 0 from then
    on; deep then sees zeros but its own biases keep some of its units alive."""
    mon, found = train(tmp_path, shift_bias("mid", 5.0))
    zf = mon.series["act/mid/zero_frac"].values
    assert max(zf[:FAULT]) < 0.9 and min(zf[FAULT:]) > 0.98  # what the fault did
    assert [a["kind"] for a in found] == ["activation_dying"], found
    alert = found[0]
    assert alert["since_step"] == FAULT and alert["step"] == FAULT + 1  # patience 2
    assert alert["tag"] == "act/mid/zero_frac" and alert["blame"][0]["name"] == "mid"
    assert alert["value"] >= 0.95 and "% of its outputs are 0 (usually 3" in alert["message"]
    assert replayed(mon) == found


def test_output_logit_divergence_and_no_blowup_blamed_on_the_head(tmp_path):
    """The output layer's lr ramped x1.15 a step from FAULT (the rest unchanged): its max
    |logit| grows until the loss diverges. The output rule names it, with an onset after
    the ramp began and before the divergence; the blow-up rule leaves the output module
    to it."""
    lr = [1e-2 * 1.15 ** max(0, s - FAULT) for s in range(110)]
    mon, found = train(tmp_path, steps=110, out_lr=lr)
    logits = mon.series["act/head/max_abs"].values
    assert max(logits[FAULT:]) > 10 * max(logits[:FAULT])  # what the ramp did
    kinds = [a["kind"] for a in found]
    assert "output_logit_divergence" in kinds and "activation_blowup" not in kinds, found
    alert = found[kinds.index("output_logit_divergence")]
    assert alert["tag"] == "act/head/max_abs"
    assert FAULT <= alert["since_step"] <= alert["step"]
    # two optimizers: each one's loss is its own series (opt/<name>/loss), the same loss
    loss = mon.series["opt/opt/loss"].values
    # the onset it dates comes before the loss diverged (3x its best, above half its
    # first value: bench/actrules.py's definition); the warning itself came 2 steps after
    # it on this run (measured: diverged 71, warned 73, onset 65), as on the bench
    ends = diverged(list(loss))
    assert ends is not None and alert["since_step"] < ends
    assert replayed(mon) == found


def test_blowup_names_the_module_whose_output_outgrows_its_input(tmp_path):
    """mid's weights scaled x1.25 a step from FAULT (a runaway layer): mid, deep and head all
    grow, deep and head only as fast as their input: mid is named, not what follows it."""

    def runaway(net, step):
        if step >= FAULT:
            w = net.mid.weight
            w.set_data(ms.Tensor(w.asnumpy() * np.float32(1.25)))

    mon, found = train(tmp_path, runaway, relu=False, steps=80)
    kinds = [a["kind"] for a in found]
    assert "activation_blowup" in kinds, found
    alert = found[kinds.index("activation_blowup")]
    assert alert["tag"] == "act/mid/max_abs" and alert["blame"][0]["name"] == "mid"
    assert alert["since_step"] >= FAULT
    assert replayed(mon) == found


@pytest.mark.parametrize("relu", [True, False])
def test_healthy_runs_raise_no_activation_alert(tmp_path, relu):
    mon, found = train(tmp_path, relu=relu, steps=120)
    loss = mon.series["train/loss"].values
    assert loss[-20:].mean() < 0.7 * loss[:5].mean()  # it did learn
    assert found == []
    assert mon.series["act/inp/norm"].steps.tolist() == list(range(120))
    # the series keep the order first recorded: the forward order a replay needs
    assert list(dict.fromkeys(t.split("/")[1] for t in mon.series if t.startswith("act/"))) == ORDER
