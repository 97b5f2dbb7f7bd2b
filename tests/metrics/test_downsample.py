"""Min/max-per-bucket downsampling: spikes and non-finite points survive, exactly."""

import numpy as np
import pytest

from msmon_nb.metrics.decimate import downsample, nonfinite_kinds, select_range


def test_short_series_is_returned_raw():
    steps = np.arange(10)
    values = np.linspace(0, 1, 10, dtype=np.float32)
    out = downsample(steps, values, 10)
    assert out.raw and out.count == 10
    assert out.steps.tolist() == steps.tolist()
    assert np.array_equal(out.values, values.astype(np.float64))


def test_each_bucket_gives_its_min_and_max_in_step_order_plus_first_and_last():
    steps = np.arange(8) * 10
    values = np.array([3, 1, 2, 5, 0, 9, 4, 4], dtype=np.float32)
    out = downsample(steps, values, 6)  # (6 - 2) // 2 = 2 buckets of 4 points
    assert not out.raw and out.count == 8
    # first, bucket 1 min@10 max@30, bucket 2 min@40 max@50, last
    assert out.steps.tolist() == [0, 10, 30, 40, 50, 70]
    assert out.values.tolist() == [3, 1, 5, 0, 9, 4]


def test_million_points_keep_one_step_spike_and_nan():
    n = 1_000_000
    steps = np.arange(n, dtype=np.int64) * 2
    values = np.sin(np.arange(n) / 5000).astype(np.float32)
    values[123_457] = 1e6  # a one-step spike
    values[777_777] = -1e6
    values[500_001] = np.nan
    values[900_000] = np.inf
    out = downsample(steps, values, 1000)
    assert len(out.steps) <= 2 * 1000
    assert out.steps[0] == 0 and out.steps[-1] == steps[-1]
    assert np.all(np.diff(out.steps) > 0)
    finite = out.values[np.isfinite(out.values)]
    assert 246_914 in out.steps.tolist() and finite.max() == 1e6
    assert 1_555_554 in out.steps.tolist() and finite.min() == -1e6
    idx, kinds = nonfinite_kinds(out.values)
    assert out.steps[idx].tolist() == [1_000_002, 1_800_000]
    assert kinds == ["nan", "inf"]


def test_bucket_of_only_nan_still_marked_and_min_max_ignore_nan():
    values = np.array([np.nan] * 4 + [1, 2, 3, 4] + [-np.inf, 7, np.nan, 5], dtype=np.float32)
    out = downsample(np.arange(12), values, 8)  # 3 buckets of 4
    finite = out.values[np.isfinite(out.values)]
    assert finite.tolist() == [1, 4, 7, 5]  # in step order
    idx, kinds = nonfinite_kinds(out.values)
    assert out.steps[idx].tolist() == [0, 8, 10]  # first NaN and first Inf of each bucket
    assert kinds == ["nan", "-inf", "nan"]


def test_uneven_last_bucket():
    values = np.arange(1001, dtype=np.float32)
    out = downsample(np.arange(1001), values, 10)
    assert out.steps[0] == 0 and out.steps[-1] == 1000
    assert len(out.steps) <= 10


def test_select_range_is_inclusive_and_open_ended():
    steps = np.array([0, 5, 10, 15, 20])
    values = np.arange(5.0)
    assert select_range(steps, values, 5, 15)[0].tolist() == [5, 10, 15]
    assert select_range(steps, values, None, 9)[0].tolist() == [0, 5]
    assert select_range(steps, values, 16, None)[0].tolist() == [20]
    assert select_range(steps, values, 21, None)[0].tolist() == []


def test_too_few_points_requested_is_an_error():
    with pytest.raises(ValueError, match="max_points=1"):
        downsample(np.arange(5), np.zeros(5), 1)
