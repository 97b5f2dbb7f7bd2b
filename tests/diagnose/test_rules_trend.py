"""lr_rise, rising_trend's building blocks, the drift onset, and a lone spike in a flat loss.

The trend rule itself is tested on real training in ``tests/scenarios/test_trend.py``;
here: the exact pieces (sliding slope, change point) and the issue-14 spike cases.
"""

import numpy as np
import pytest

from msmon_nb.diagnose import Diagnoser, detect, diagnose
from msmon_nb.diagnose.trend import SlidingSlope, hinge_onset, hinge_rise, hinge_slope, ols_t


def test_sliding_slope_matches_a_least_squares_fit():
    rng = np.random.default_rng(0)
    values = rng.normal(size=200).cumsum()
    slope = SlidingSlope(30)
    for i, v in enumerate(values):
        slope.add(float(v))
        if i >= 29:
            window = values[i - 29 : i + 1]
            expected = np.polyfit(np.arange(30), window, 1)[0]
            assert slope.fit()[0] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_hinge_onset_is_the_first_rising_step():
    steps = list(range(0, 600, 10))
    values = [0.0] * 30 + [0.1 * i for i in range(1, 31)]
    assert hinge_onset(steps, values) == 300


def test_hinge_rise_finds_the_kink_and_respects_its_limits():
    rng = np.random.default_rng(1)
    values = list(0.05 * rng.standard_normal(60))
    for i in range(45, 60):  # flat, then +0.07 a step over the last 15 values
        values[i] += 0.07 * (i - 44)
    t, k, rise = hinge_rise(values, min_flat=20, min_rise=10, rise=np.log(2.0))
    assert t > 10 and 42 <= k <= 46 and rise == pytest.approx(15 * 0.07, rel=0.15)
    # a rise shorter than min_rise, or smaller than asked for, is no fit at all
    assert hinge_rise(values, min_flat=20, min_rise=20, rise=np.log(2.0))[1] <= 39
    assert hinge_rise(values, min_flat=20, min_rise=10, rise=np.log(10.0)) == (0.0, -1, 0.0)


def test_hinge_slope_is_exact_on_a_hinge():
    values = [2.0] * 20 + [2.0 + 0.3 * i for i in range(1, 11)]
    assert hinge_slope(values, 19) == pytest.approx(0.3)


def test_ols_t_matches_a_least_squares_fit():
    rng = np.random.default_rng(2)
    y = 0.01 * np.arange(40) + rng.standard_normal(40)
    x = np.arange(40)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    se = np.sqrt(resid @ resid / 38 / ((x - x.mean()) @ (x - x.mean())))
    assert ols_t(list(y)) == pytest.approx(slope / se, rel=1e-9)


@pytest.mark.parametrize(("n", "k"), [(5000, 3000), (100_000, 73_736)])
def test_one_spike_in_a_flat_loss_is_a_spike_never_a_divergence(n, k):
    """Issue 14: loss 1 +- 0.01 with one 50 gave loss_divergence 'since step 291'."""
    rng = np.random.default_rng(0)
    steps = np.arange(n)
    loss = 1.0 + 0.01 * rng.standard_normal(n)
    loss[k] = 50.0
    alerts = [a for a in diagnose({"train/loss": (steps, loss)}) if a.kind != "loss_plateau"]
    assert [(a.kind, a.step, a.since_step) for a in alerts] == [("loss_spike", k, k)]


@pytest.mark.parametrize("seed", range(10))
def test_drift_onset_never_before_the_rise(seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(3000)
    loss = 1.0 + 0.01 * rng.standard_normal(3000)
    loss[2000:] *= 1.01 ** np.arange(1000)  # the first risen value is at 2001
    [alert] = detect("loss_divergence", steps, loss)
    assert 2000 <= alert.since_step <= 2005 < alert.step


def _lr_alerts(lr, **params):
    return [(a.since_step, a.step) for a in detect("lr_rise", list(range(len(lr))), lr, **params)]


def test_lr_ramp_after_a_constant_lr_flagged_at_its_first_step():
    lr = [0.02 * 1.06 ** max(0, s - 99) for s in range(200)]
    [(since, step)] = _lr_alerts(lr)
    assert since == 100 and step == 111  # 1.06 ** 12 > 2
    message = detect("lr_rise", list(range(200)), lr)[0].message
    assert message.startswith("learning_rate rising since step 100: ")
    assert "x1.1 a step" in message and "check the schedule" in message


def test_declared_rise_is_quiet():
    lr = [0.02 * 1.06 ** max(0, s - 99) for s in range(200)]
    assert _lr_alerts(lr, until=150) == [(100, 150)]
    assert _lr_alerts(lr, until=500) == []


@pytest.mark.parametrize(
    "lr",
    [
        [
            1e-3 * min(1.0, (s + 1) / 200) * (0.5 + 0.5 * np.cos(np.pi * s / 2000))
            for s in range(2000)
        ],
        [0.1 * 0.1 ** (s // 300) for s in range(1000)],
        [0.1 * (1 + s // 50) / 5 if s < 250 else 0.1 for s in range(600)],  # per-epoch warmup
        [0.01 + 0.09 * abs((s % 200) - 100) / 100 for s in range(1000)],  # triangular cycles
        [0.1 * 0.5 * (1 + np.cos(np.pi * (s % 300) / 300)) for s in range(1200)],  # restarts
        [1e-3 * (s + 1) / 3000 for s in range(3000)],  # a long warmup, float32-like ties below
    ],
    ids=["warmup-cosine", "step", "epoch-warmup", "triangular", "restarts", "long-warmup"],
)
def test_healthy_schedules_do_not_rise(lr):
    lr = [float(np.float32(v)) for v in lr]
    assert _lr_alerts(lr) == []


def test_data_bound_needs_a_real_wait():
    """A loop over in-memory tensors on a tiny model: the loop's own 0.3 ms between steps
    is most of a 0.2 ms step, but no input pipeline would win it back."""
    diag = Diagnoser()
    alerts = []
    for step in range(100):
        alerts += diag.update(step, {"train/data_time": 0.0003, "train/compute_time": 0.0002})
    assert [a for a in alerts if a.kind == "data_bound"] == []
    diag = Diagnoser({"data_bound": {"min_wait": 0.0}})
    alerts = []
    for step in range(100):
        alerts += diag.update(step, {"train/data_time": 0.0003, "train/compute_time": 0.0002})
    assert [a.kind for a in alerts] == ["data_bound"]
