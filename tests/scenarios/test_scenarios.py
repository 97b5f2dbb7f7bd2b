"""Real MindSpore training on CPU with scripted failures, monitored end to end.

Each failure must be flagged within 2 collected steps of its scripted onset, with that
onset as ``since_step``; healthy runs (several seeds and optimizers) raise nothing. The
loops are ordinary ``value_and_grad`` + optimizer loops under ``mon.watch()``; alerts
come from the monitor itself (``mon.alerts`` and the run's ``alerts.jsonl``).
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 160
ONSET = 100


def run_loop(
    tmp_path, *, steps=STEPS, make_opt=None, seed=0, alerts=None, hooks=None, net=None, loss=None
):
    """Train the tiny MLP under a Monitor; ``hooks[step](ctx)`` scripts the failure."""
    x, y = tiny.data(seed=seed)
    net = net or tiny.mlp(seed=seed, hidden=32)
    base_loss = loss or tiny.loss_fn()
    opt = (make_opt or (lambda p: nn.Momentum(p, learning_rate=0.05, momentum=0.9)))(
        net.trainable_params()
    )
    ctx = {"x_scale": 1.0, "prob_scale": 1.0, "label_shift": 0, "net": net, "opt": opt}

    def forward(a, b):
        if ctx["label_shift"]:  # scripted outlier batch: every label wrong
            b = (b + ctx["label_shift"]) % 3
        logits = net(a * ctx["x_scale"])
        if ctx["prob_scale"] != 1.0:  # scripted log(0): probabilities multiplied by zero
            probs = ops.softmax(logits, axis=-1) * ctx["prob_scale"]
            return -ops.log(ops.gather_elements(probs, 1, b.reshape(-1, 1))).mean()
        return base_loss(logits, b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    with Monitor(save_dir=str(tmp_path), alerts=alerts or {}) as mon, mon.watch():
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=steps, seed=seed + 1)):
            if hooks and i in hooks:
                hooks[i](ctx)
            _loss, grads = grad_fn(a, b)
            opt(grads)
    return mon


def flagged(mon, kind, onset):
    """The alert of ``kind``, checked to be on time and dated at the onset."""
    alerts = [a for a in mon.alerts if a.kind == kind]
    assert alerts, f"no {kind} alert; got {[(a.kind, a.since_step, a.step) for a in mon.alerts]}"
    alert = alerts[0]
    assert alert.since_step == onset, (alert.since_step, onset, alert.message)
    assert alert.step <= onset + 2, f"{kind} confirmed at {alert.step}, onset {onset}"
    on_disk = [a for a in load_run(mon.run_dir).alerts if a["kind"] == kind]
    assert on_disk and on_disk[0]["since_step"] == onset
    return alert


def test_lr_spike_explodes_gradients(tmp_path):
    lr = [0.05] * STEPS
    lr[ONSET - 1 :] = [20.0] * (STEPS - ONSET + 1)  # applied by the update at ONSET - 1
    mon = run_loop(tmp_path, make_opt=lambda p: nn.SGD(p, learning_rate=lr))
    alert = flagged(mon, "grad_explosion", ONSET)  # shows in the gradients of the next step
    assert "grad_norm" in alert.message and "since step" in alert.message


def test_one_outlier_batch_is_a_loss_spike(tmp_path):
    def corrupt(ctx):
        ctx["label_shift"] = 1

    def restore(ctx):
        ctx["label_shift"] = 0

    mon = run_loop(tmp_path, hooks={ONSET: corrupt, ONSET + 1: restore})
    flagged(mon, "loss_spike", ONSET)


class SigmoidMSE(nn.Cell):
    """Squared error on sigmoid outputs: saturated sigmoids pass almost no gradient."""

    def construct(self, logits, labels):
        target = ops.one_hot(labels, 3, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        return ((ops.sigmoid(logits) - target) ** 2).mean()


def test_saturating_activations_vanish_gradients(tmp_path):
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(8, 32), nn.Sigmoid(), nn.Dense(32, 3)])

    def saturate(ctx):  # e.g. a bad re-initialisation: every weight 1000x too large
        for param in ctx["net"].trainable_params():
            param.set_data(param * 1000.0)

    mon = run_loop(tmp_path, net=net, loss=SigmoidMSE(), hooks={ONSET: saturate})
    flagged(mon, "grad_vanishing", ONSET)
    assert np.isfinite(mon.series["train/loss"].values).all()  # the loss itself looks fine


def test_log_of_zero_gives_nan_flagged_at_its_step(tmp_path):
    def zero_probs(ctx):
        ctx["prob_scale"] = 0.0

    mon = run_loop(tmp_path, hooks={ONSET: zero_probs})
    alert = flagged(mon, "nonfinite", ONSET)
    assert alert.severity == "critical"


def test_warmup_that_never_starts(tmp_path):
    broken = [1e-9] * STEPS  # a schedule bug: the warmup's peak was never applied
    mon = run_loop(
        tmp_path,
        make_opt=lambda p: nn.Momentum(p, learning_rate=broken, momentum=0.9),
        alerts={"lr_warmup": {"warmup_steps": 20}},
    )
    flagged(mon, "lr_warmup", 0)


def test_stalled_loss(tmp_path):
    # the learning rate is too small to move anything: the loss stays where it started
    mon = run_loop(
        tmp_path,
        steps=200,
        alerts={"loss_plateau": {"window": 40}},
        seed=3,
        hooks={0: _freeze_learning},
    )
    alerts = [a for a in mon.alerts if a.kind == "loss_plateau"]
    assert alerts, [(a.kind, a.since_step) for a in mon.alerts]
    # a plateau is only known after its window: the onset is exact, the alert comes later
    assert alerts[0].since_step == 0
    assert alerts[0].step <= 40 + 2


def _freeze_learning(ctx):
    ctx["opt"].learning_rate.set_data(ms.Tensor(np.float32(1e-6)))


HEALTHY = [
    ("momentum", 0, lambda p: nn.Momentum(p, learning_rate=0.05, momentum=0.9)),
    ("adam", 1, lambda p: nn.Adam(p, learning_rate=1e-2)),
    ("sgd", 2, lambda p: nn.SGD(p, learning_rate=0.1)),
    ("adamw", 3, lambda p: nn.AdamWeightDecay(p, learning_rate=5e-3, weight_decay=0.01)),
    (
        "momentum-warmup",
        4,
        lambda p: nn.Momentum(p, learning_rate=tiny.warmup_lr(STEPS, 0.1, 30), momentum=0.9),
    ),
]


@pytest.mark.parametrize(("name", "seed", "make_opt"), HEALTHY, ids=[h[0] for h in HEALTHY])
def test_healthy_runs_raise_nothing(tmp_path, name, seed, make_opt):
    mon = run_loop(tmp_path, make_opt=make_opt, seed=seed)
    assert mon.alerts == [], [(a.kind, a.since_step, a.message) for a in mon.alerts]
    assert load_run(mon.run_dir).alerts == []
