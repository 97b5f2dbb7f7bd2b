"""RollingWindow and Levels: running median, quantiles and MAD equal numpy's."""

import math

import numpy as np
import pytest

from msmon_nb.diagnose.window import Levels, RollingWindow


@pytest.mark.parametrize("size", [1, 2, 7, 64])
def test_sliding_statistics_equal_numpy(size):
    rng = np.random.default_rng(size)
    data = rng.standard_cauchy(500)  # heavy tails and repeated extremes
    data[100:110] = 3.0  # ties
    win = RollingWindow(size, refresh=1)
    for i, x in enumerate(data):
        win.add(float(x))
        ref = data[max(0, i + 1 - size) : i + 1]
        assert len(win) == len(ref)
        assert win.median() == pytest.approx(np.median(ref), abs=1e-12)
        for q in (0.1, 0.25, 0.5, 0.9, 1.0):
            assert win.quantile(q) == pytest.approx(np.quantile(ref, q), abs=1e-12)
        mad = np.median(np.abs(ref - np.median(ref)))
        assert win.mad() == pytest.approx(mad, abs=1e-12)
        assert win.sigma() == pytest.approx(1.4826 * mad, abs=1e-12)
    assert win.values() == pytest.approx(list(data[-size:]))


def test_mad_is_refreshed_at_most_every_refresh_additions():
    win = RollingWindow(10, refresh=4)
    for x in range(10):
        win.add(float(x))
    assert win.mad() == 2.5  # 0..9: median 4.5, |dev| median 2.5
    for _ in range(3):
        win.add(100.0)  # three adds: the cached MAD is kept
    assert win.mad() == 2.5
    win.add(100.0)  # the fourth forces a recomputation
    values = np.array(win.values())
    assert win.mad() == np.median(np.abs(values - np.median(values)))
    assert win.mad() != 2.5


def test_window_never_grows_past_its_size():
    win = RollingWindow(16)
    for x in range(10_000):
        win.add(float(x % 97))
    assert len(win) == 16
    assert len(win.values()) == 16


def test_levels_report_the_level_before_the_value_and_feed_once_per_step():
    lv = Levels(4, upper=True)
    for step, x in enumerate([1.0, 2.0, 3.0, 4.0]):
        lv.observe(step, x)
    lv.observe(4, 100.0)
    assert lv.n == 4
    assert lv.median == 2.5  # of 1..4, not including 100
    assert lv.q90 == pytest.approx(np.quantile([1, 2, 3, 4], 0.9))
    lv.observe(4, 100.0)  # a second rule at the same step: no second add
    assert lv.win.values() == [2.0, 3.0, 4.0, 100.0]
    lv.observe(5, 100.0)  # same value, next step: added
    assert lv.win.values() == [3.0, 4.0, 100.0, 100.0]


def test_log_levels_skip_values_without_a_log():
    lv = Levels(8, log=True)
    lv.observe(0, 100.0)
    lv.observe(1, 0.0)
    assert lv.x is None
    assert lv.win.values() == [2.0]
    lv.observe(2, 1e-3)
    assert lv.x == pytest.approx(-3.0)
    assert lv.median == pytest.approx(2.0)
    assert math.isclose(lv.win.median(), -0.5)
