"""Decimation keeps every spike; the incremental form equals the one-shot form."""

import numpy as np
import pytest

from msmon_nb.metrics.decimate import Decimator, downsample, ema
from msmon_nb.metrics.norms import global_norm


@pytest.mark.parametrize("spike_at", [0, 1, 4_999, 123_457, 999_999])
def test_one_step_spike_survives(spike_at):
    n = 1_000_000
    values = np.random.default_rng(0).normal(size=n)
    values[spike_at] = 1e6
    steps = np.arange(n)
    xs, ys, raw, count = downsample(steps, values, 1000)
    assert len(xs) <= 1000 and not raw and count == n
    assert ys.max() == 1e6 and xs[ys.argmax()] == spike_at
    assert (xs[0], ys[0], xs[-1], ys[-1]) == (0, values[0], n - 1, values[-1])
    dec = Decimator(300)
    dec.update(steps, values)
    px, py = dec.points(steps, values)
    assert len(px) <= 2 * 300 + dec.block
    assert py.max() == 1e6 and px[py.argmax()] == spike_at


def test_incremental_equals_one_shot_and_tracks_nonfinite():
    n = 50_003
    rng = np.random.default_rng(1)
    values = rng.normal(size=n)
    values[[10, 40_000]] = [np.nan, np.inf]
    steps = np.arange(n) * 2
    whole = Decimator(100)
    whole.update(steps, values)
    parts = Decimator(100)
    for end in range(0, n + 997, 997):
        parts.update(steps[: min(end, n)], values[: min(end, n)])
    for a, b in zip(whole.points(steps, values), parts.points(steps, values), strict=True):
        np.testing.assert_array_equal(a, b)
    assert whole.nonfinite_steps == parts.nonfinite_steps == [20, 80_000]
    assert np.all(np.isfinite(whole.points(steps, values)[1]))


def test_bucket_means_average_the_data():
    steps = np.arange(4096)
    values = np.repeat(np.arange(8, dtype=float), 512)
    dec = Decimator(8)
    dec.update(steps, values)
    xs, ys = dec.means(steps, values)
    np.testing.assert_allclose(ys, np.arange(8))
    np.testing.assert_allclose(xs, np.arange(8) * 512 + 255.5)


def test_ema_matches_tensorboard_definition():
    values = np.array([1.0, 2.0, np.nan, 4.0])
    out = ema(values, 0.5)
    assert out[0] == 1.0
    assert out[1] == pytest.approx((0.5 * 0.5 * 1 + 0.5 * 2) / (1 - 0.25))
    assert np.isnan(out[2])
    assert np.isfinite(out[3])


def test_global_norm_matches_float64_reference():
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(300, 700)).astype(np.float32), rng.normal(size=5).astype(np.float32)]
    ref = np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays))
    assert global_norm(arrays) == pytest.approx(ref, rel=1e-6)
    assert np.isnan(global_norm([np.array([1.0, np.nan], np.float32)]))
