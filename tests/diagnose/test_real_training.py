"""Real MindSpore training on CPU, recorded by the real Monitor around an unchanged
value_and_grad + optimizer loop: healthy runs raise nothing; real failures are flagged
at the step they show. The Diagnoser is fed live (a boundary hook, as the monitor will
feed it) and by replaying ``mon.series``; both must agree."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.diagnose import Diagnoser, diagnose
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 200
OPTIMIZERS = {
    "momentum": lambda params: nn.Momentum(params, learning_rate=0.05, momentum=0.9),
    "adam": lambda params: nn.Adam(params, learning_rate=1e-2),
    "sgd": lambda params: nn.SGD(params, learning_rate=0.1),
}


def train(save_dir, make_opt, seed, nan_loss_at=None):
    """Train the tiny MLP on Gaussian blobs; returns (monitor, alerts seen live).

    ``nan_loss_at``: the step whose loss is multiplied by NaN, as a log(0) in a loss
    would (NaN inputs are not enough: ReLU maps NaN to 0 on this CPU backend).
    """
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = tiny.data(seed=seed)
    net = tiny.mlp(seed=seed, hidden=32)
    loss_fn = tiny.loss_fn()
    opt = make_opt(net.trainable_params())
    factor = [1.0]
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b) * factor[0], None, opt.parameters)
    live = Diagnoser()
    seen = []
    fed = []

    def feed(mon):  # what the monitor will do once per collected step
        step = mon.last_step
        if step is None or (fed and fed[-1] == step):
            return
        values = {t: s.last() for t, s in mon.series.items() if s.n and s.steps[-1] == step}
        fed.append(step)
        seen.extend(live.update(step, values))

    with Monitor(save_dir=str(save_dir)) as mon, mon.watch():
        mon.add_boundary_hook(feed)
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS, seed=seed + 1)):
            factor[0] = float("nan") if i == nan_loss_at else 1.0
            _loss, grads = grad_fn(a, b)  # the user's loop, unchanged
            opt(grads)
    assert fed == list(range(STEPS))
    return mon, seen


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_healthy_real_runs_raise_nothing(tmp_path, opt, seed):
    mon, live = train(tmp_path, OPTIMIZERS[opt], seed)
    series = mon.series
    loss = series["train/loss"].values
    assert len(loss) == len(series["train/grad_norm"]) == STEPS
    assert loss[-20:].mean() < 0.6 * loss[:5].mean()  # it did learn
    assert live == []
    assert diagnose(series) == []


def test_real_lr_spike_flagged_when_it_shows(tmp_path):
    """The lr of step 100 drives the update at step 100, so the first loss and gradient
    computed on the damaged weights are those of step 101: that is the onset."""
    lr = [0.05] * 100 + [20.0] * 100
    make = lambda params: nn.Momentum(params, learning_rate=lr, momentum=0.9)  # noqa: E731
    mon, live = train(tmp_path, make, seed=0)
    assert mon.series["train/learning_rate"].values[100] == pytest.approx(20.0)
    assert [a.to_dict() for a in live] == [a.to_dict() for a in diagnose(mon.series)]
    first = {}
    for alert in live:
        first.setdefault((alert.kind, alert.tag), alert)
    explosion = first[("grad_explosion", "train/grad_norm")]
    assert explosion.since_step == 101
    assert explosion.step <= 103
    assert all(a.step >= 101 for a in live)


def test_real_nan_loss_flagged_at_its_step(tmp_path):
    mon, live = train(tmp_path, OPTIMIZERS["adam"], seed=1, nan_loss_at=120)
    assert np.isnan(mon.series["train/loss"].values[120])
    assert not np.isnan(mon.series["train/loss"].values[119])
    assert [a.to_dict() for a in live] == [a.to_dict() for a in diagnose(mon.series)]
    assert [(a.kind, a.tag, a.step, a.since_step) for a in live[:2]] == [
        ("nonfinite", "train/loss", 120, 120),
        ("nonfinite", "train/grad_norm", 120, 120),
    ]
