"""``action: skip``: a bad batch's update is held back, bit for bit, on every loop shape.

Real CPU training of a tiny MLP with Adam (parameters, two moments per parameter, beta
powers and ``global_step``: every piece of optimizer state there is). One batch at a
known step is an outlier (inputs x30: grad_norm ~30 against ~0.6 normally, loss still
finite). Around every step the optimizer's whole state is copied to numpy; on the
skipped step every array must be exactly equal before and after, on the other steps the
weights and ``global_step`` must move. Runs on MindSpore 2.10 and, in CI's version job
(tests/collect), on 2.7.1.
"""

from __future__ import annotations

import json
import math
import re

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from msmon_nb.config import ConfigError
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 8
BAD = 3  # the outlier batch's index in the loop
SCALE = 30.0
LIMIT = 5.0  # skip_above: normal grad_norm here is 0.5-0.8, the outlier's ~50


def skip_config(tmp_path, **alerts):
    alerts = alerts or {"grad_explosion": {"action": "skip", "skip_above": LIMIT}}
    return {"save_dir": str(tmp_path), "alerts": alerts}


def state(opt) -> dict[str, np.ndarray]:
    """A copy of everything the optimizer owns: params, moments, beta powers, global_step."""
    return {p.name: p.asnumpy().copy() for _, p in opt.parameters_and_names()}


def diff(before, after) -> set[str]:
    return {name for name in before if not np.array_equal(before[name], after[name])}


def batches(bad=(BAD,), steps=STEPS, scale=SCALE):
    x, y = tiny.data()
    out = []
    for i, (a, b) in enumerate(tiny.batches(x, y, steps=steps)):
        out.append((a * scale if i in bad else a, b))
    return out


def outliers(data, steps):
    """Large inputs with wrong labels at ``steps``: the loss and the gradient both jump,
    whatever the batch (scaled inputs alone can saturate the softmax and shrink it)."""
    return [(a * 50.0, (b + 1) % 3) if i in steps else (a, b) for i, (a, b) in enumerate(data)]


def adam():
    net = tiny.mlp(seed=3)
    return net, nn.Adam(net.trainable_params(), learning_rate=0.01)


def pynative_loop():
    net, opt = adam()
    loss_fn = tiny.loss_fn()

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    return step, opt


def jit_step():
    net, opt = adam()
    loss_fn = tiny.loss_fn()

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    return step, opt


def train_cell():
    net, opt = adam()
    return nn.TrainOneStepCell(nn.WithLossCell(net, tiny.loss_fn()), opt), opt


def check_state_changes(changes, opt, skipped):
    """Skipped steps: nothing changed. Others: the weights and global_step moved."""
    weights = {p.name for p in opt.parameters}
    for i, changed in enumerate(changes):
        if i in skipped:
            assert changed == set(), f"step {i} skipped but changed {sorted(changed)}"
        else:
            assert weights <= changed, f"step {i}: weights not all updated"
            assert "global_step" in changed
            assert {"beta1_power", "beta2_power"} <= changed


def check_run(mon, bad_steps, kind="grad_explosion", in_a_row=None):
    """alerts.jsonl, mon.alerts and train/skipped_steps tell of exactly ``bad_steps``."""
    in_a_row = in_a_row or range(1, len(bad_steps) + 1)
    run = load_run(mon.run_dir)
    lines = [json.loads(line) for line in (mon.write_dir / "alerts.jsonl").read_text().splitlines()]
    skips = [a for a in lines if a.get("action") == "skip"]
    assert [a["step"] for a in skips] == list(bad_steps)
    for n, alert in zip(in_a_row, skips, strict=True):
        assert alert["kind"] == kind
        assert f"at step {alert['step']}: update skipped ({n} in a row)" in alert["message"]
    assert [a.kind for a in mon.alerts if "update skipped" in a.message] == [kind] * len(bad_steps)
    skipped = run.scalars("train/skipped_steps")
    counts = dict(zip(skipped.steps.tolist(), skipped.values.tolist(), strict=True))
    for n, step in enumerate(bad_steps, 1):
        assert counts[step] == n
    assert skipped.values[-1] == len(bad_steps)
    return run, skips


@pytest.mark.parametrize("shape", ["pynative", "jit", "train_cell", "train_cell_graph"])
def test_watched_loop_skips_the_outlier_bit_exactly(tmp_path, shape):
    if shape == "train_cell_graph":
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        make = {"pynative": pynative_loop, "jit": jit_step}.get(shape, train_cell)
        step, opt = make()
        changes = []
        with Monitor(skip_config(tmp_path)) as mon, mon.watch():
            for a, b in batches():
                before = state(opt)
                step(a, b)
                changes.append(diff(before, state(opt)))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    check_state_changes(changes, opt, skipped={BAD})
    run, skips = check_run(mon, [BAD])
    assert re.match(r"grad_norm [0-9.]+ >= limit 5 at step 3: update skipped", skips[0]["message"])
    # the skipped step's gradient norm is still recorded: the chart shows the outlier
    norm = run.scalars("train/grad_norm")
    recorded = norm.values[norm.steps.tolist().index(BAD)]
    assert recorded > 2 * LIMIT
    np.testing.assert_allclose(skips[0]["value"], recorded, rtol=1e-5)
    assert run.status == "finished"
    # the user's optimizer is itself again: a later outlier updates
    before = state(opt)
    step(*batches(bad=(0,), steps=1)[0])
    assert diff(before, state(opt))


def test_watched_loop_stops_after_n_skips_in_a_row(tmp_path):
    step, _opt = pynative_loop()
    config = skip_config(
        tmp_path,
        grad_explosion={"action": "skip", "skip_above": LIMIT},
        max_skips_in_a_row=3,
    )
    seen = []
    with Monitor(config) as mon, mon.watch():
        for i, (a, b) in enumerate(batches(bad=(2, 4, 5, 6, 7), steps=12)):
            seen.append(i)
            step(a, b)
    assert seen == list(range(7))  # stopped at the boundary after the third skip in a row
    run, skips = check_run(mon, [2, 4, 5, 6], in_a_row=[1, 1, 2, 3])  # step 3 was normal
    assert "3 updates skipped in a row (limit 3): stopping the run" in skips[-1]["message"]
    assert run.status == "stopped"
    marker = json.loads((mon.write_dir / "msmon_run.json").read_text())
    assert marker["stop_reason"].startswith("3 updates skipped in a row (limit 3): grad_norm")
    # each skip and the stop it led to are interventions of the alert action
    acts = [(i["step"], i["who"], i["what"], i["arg"]) for i in run.interventions]
    assert acts == [
        *((s, "alert action", "skip", "grad_explosion") for s in (2, 4, 5, 6)),
        (6, "alert action", "stop", "grad_explosion"),
    ]


class StateProbe(Callback):
    """The optimizer's whole state around each Model.train step."""

    def __init__(self, opt):
        super().__init__()
        self.opt = opt
        self.changes = []
        self._before = None

    def on_train_step_begin(self, run_context):
        self._before = state(self.opt)

    def on_train_step_end(self, run_context):
        self.changes.append(diff(self._before, state(self.opt)))


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_model_train_skips_the_outlier_bit_exactly(tmp_path, mode):
    x, y = tiny.data(n=32 * STEPS)
    x = x.copy()
    x[32 * BAD : 32 * (BAD + 1)] *= SCALE  # Model.train's step BAD + 1 (it counts from 1)
    ms.set_context(mode=mode)
    try:
        net, opt = adam()
        model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
        probe = StateProbe(opt)
        data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
        with Monitor(skip_config(tmp_path)) as mon:
            model.train(1, data, callbacks=[probe, mon.callback()])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    check_state_changes(probe.changes, opt, skipped={BAD})
    check_run(mon, [BAD + 1])


def test_model_train_stops_after_n_skips_in_a_row(tmp_path):
    x, y = tiny.data(n=32 * 10)
    x = x.copy()
    x[32 * 4 :] *= SCALE  # every step from 5 on is an outlier
    net, opt = adam()
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    probe = StateProbe(opt)
    config = skip_config(
        tmp_path, grad_explosion={"action": "skip", "skip_above": LIMIT}, max_skips_in_a_row=2
    )
    with Monitor(config) as mon:
        model.train(1, data, callbacks=[probe, mon.callback()])
    assert len(probe.changes) == 6  # steps 1-4 normal, 5 and 6 skipped, then stopped
    check_state_changes(probe.changes, opt, skipped={4, 5})
    run, skips = check_run(mon, [5, 6])
    assert run.status == "stopped"
    assert "2 updates skipped in a row (limit 2)" in skips[-1]["message"]


def test_relative_limit_from_the_running_median(tmp_path):
    """No fixed limit: factor x the running median of grad_norm, refreshed from the host."""
    step, opt = pynative_loop()
    config = skip_config(tmp_path, grad_explosion={"action": "skip", "factor": 10.0})
    changes = []
    with Monitor(config) as mon, mon.watch():
        for a, b in outliers(batches(bad=(), steps=16), (5, 14)):
            before = state(opt)
            step(a, b)
            changes.append(diff(before, state(opt)))
    # min_history (10) grad norms are needed first: the outlier at step 5 goes through
    assert changes[5]
    check_state_changes(changes, opt, skipped={14})
    _run, skips = check_run(mon, [14])
    assert "update skipped" in skips[0]["message"]


@pytest.mark.parametrize("shape", ["train_cell", "pynative"])
def test_loss_spike_and_nonfinite_skip(tmp_path, shape):
    """loss_spike judges the step's loss against the spike rule's bar; nonfinite skips
    a NaN loss/grad. The loss reaches the gate from a tap inside a hand-driven
    TrainOneStepCell, or from value_and_grad's output in a PyNative loop."""
    step, opt = train_cell() if shape == "train_cell" else pynative_loop()
    config = skip_config(
        tmp_path,
        loss_spike={"action": "skip", "min_history": 5},
        nonfinite={"action": "skip"},
    )
    data = outliers(batches(bad=(), steps=14), (8,))  # a loss spike
    a, b = data[11]
    data[11] = (a * float("nan"), b)  # NaN inputs: NaN loss and gradients
    changes = []
    with Monitor(config) as mon, mon.watch():
        for a, b in data:
            before = state(opt)
            step(a, b)
            changes.append(diff(before, state(opt)))
    check_state_changes(changes, opt, skipped={8, 11})
    lines = [json.loads(line) for line in (mon.write_dir / "alerts.jsonl").read_text().splitlines()]
    skips = [(a["step"], a["kind"]) for a in lines if a.get("action") == "skip"]
    assert skips == [(8, "loss_spike"), (11, "nonfinite")]
    messages = [a["message"] for a in lines if a.get("action") == "skip"]
    assert re.match(r"loss [0-9.]+ >= limit [0-9.]+ at step 8: update skipped", messages[0])
    # NaN inputs: MindSpore's CPU cross-entropy still returns a finite loss, the
    # gradients are NaN
    assert messages[1].startswith("non-finite grad_norm nan at step 11: update skipped")
    assert all(math.isfinite(v) for p in opt.parameters for v in p.asnumpy().ravel())


def test_explicit_loop_warns_once_that_it_cannot_skip(tmp_path):
    with Monitor(skip_config(tmp_path)) as mon:
        with pytest.warns(Warning, match="cannot skip|nothing can be skipped"):
            mon.step(loss=1.0, grad_norm=0.5)
        mon.step(loss=1.0, grad_norm=0.5)
    assert mon.alerts == []


@pytest.mark.parametrize(
    ("alerts", "words"),
    [
        ({"loss_plateau": {"action": "skip"}}, ["loss_plateau", "grad_explosion, loss_spike"]),
        ({"action": "skip"}, ["alerts.action='skip'", "nonfinite"]),
        ({"grad_explosion": {"skip_above": 10.0}}, ["skip_above", "action: skip"]),
        ({"grad_explosion": {"action": "skip", "skip_above": -1}}, ["skip_above=-1", "> 0"]),
        ({"max_skips_in_a_row": 0}, ["max_skips_in_a_row=0", ">= 1"]),
    ],
)
def test_config_errors_are_clear(tmp_path, alerts, words):
    with pytest.raises(ConfigError) as info:
        Monitor(save_dir=str(tmp_path), alerts=alerts)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("shape", ["jit", "train_cell_graph"])
def test_optimizer_tap_keeps_adam_exact(tmp_path, shape):
    """The optimizer wrapper (with or without skip) calls the original construct as a
    method: called as a function, MindSpore dropped Adam's ``self.beta1_power = ...``
    and the beta powers froze after the first step. A watched run must train exactly
    like an unwatched twin."""

    def train(watched):
        if shape == "train_cell_graph":
            ms.set_context(mode=ms.GRAPH_MODE)
        try:
            step, opt = jit_step() if shape == "jit" else train_cell()
            if watched:
                with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
                    for a, b in batches(bad=()):
                        step(a, b)
            else:
                for a, b in batches(bad=()):
                    step(a, b)
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
        return state(opt)

    plain, watched = train(False), train(True)
    assert plain["beta1_power"] == pytest.approx(0.9**STEPS)
    for name, value in plain.items():
        np.testing.assert_array_equal(watched[name], value, err_msg=name)


class Boom(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 2:
            raise RuntimeError("boom")


def test_a_crashed_model_train_leaves_no_optimizer_gated(tmp_path):
    """on_train_end never runs when Model.train raises: closing the monitor unwraps."""
    original = vars(nn.Adam)["construct"]
    x, y = tiny.data(n=32 * 4)
    net, opt = adam()
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    with pytest.raises(RuntimeError, match="boom"), Monitor(skip_config(tmp_path)) as mon:
        model.train(1, data, callbacks=[mon.callback(), Boom()])
    assert vars(nn.Adam)["construct"] is original
    assert not [k for k in vars(nn.Adam) if k.startswith("_msmon")]
    assert mon.status == "interrupted"
