"""The live series stays bounded however long the run (bench/long.py found it growing
24 bytes per point per tag), keeps its recent points exactly and its spikes visible, and
the panel's cursor into it survives the thinning."""

import numpy as np
import pytest

from msmon_nb.metrics.series import THIN_TO, Series, SeriesStore
from msmon_nb.notebook.updates import PointStream, unpack


def nbytes(s: Series) -> int:
    return s._steps.nbytes + s._values.nbytes + s._walls.nbytes


def test_a_series_stops_growing_at_its_limit_and_keeps_recent_points_raw():
    s = Series(limit=4096)
    spike = 1000
    for i in range(200_000):
        s.append(i, 1e6 if i == spike else float(i % 7), 1000.0 + i)
    assert s.appended == 200_000
    assert s.n <= 4096
    assert nbytes(s) == 4096 * 24  # the arrays never grew past the limit
    # the newest points are all there, in order, unthinned
    assert s.steps[-1000:].tolist() == list(range(199_000, 200_000))
    assert s.walls[-1].item() == 1000.0 + 199_999
    # the distant past is an outline: the first step, the spike, steps still increasing
    assert s.steps[0] == 0
    assert spike in s.steps.tolist() and s.values.max() == 1e6
    assert (np.diff(s.steps) > 0).all()


def test_nan_in_the_thinned_past_stays_visible():
    s = Series(limit=1024)
    for i in range(20_000):
        s.append(i, float("nan") if i == 77 else 1.0, 0.0)
    assert 77 in s.steps[np.isnan(s.values)].tolist()


def test_extend_past_the_limit_thins_too():
    s = Series(limit=1024)
    s.extend(np.arange(10_000), np.ones(10_000), np.zeros(10_000))
    assert s.appended == 10_000 and s.n <= 1024 and s.steps[-1] == 9_999


def test_a_limit_too_small_to_thin_is_refused():
    with pytest.raises(ValueError, match="limit=10"):
        Series(limit=10)
    assert 2 * THIN_TO <= 1024


def test_the_stream_sends_each_new_point_once_across_thinning():
    store = SeriesStore()
    store._series["train/loss"] = Series(limit=1024)
    stream = PointStream(max_new=10_000, reset_points=10_000)
    got: list[int] = []
    for i in range(5_000):
        store.add(i, 0.0, {"train/loss": float(i)})
        if i % 300 == 299:  # a take every 300 steps: each before half the limit is thinned
            chunk = stream.take(store)
            got += unpack(chunk.keys, chunk.counts, chunk.buffer)["train/loss"][0].tolist()
    chunk = stream.take(store)
    got += unpack(chunk.keys, chunk.counts, chunk.buffer)["train/loss"][0].tolist()
    assert got == list(range(5_000))
    assert not stream.shrank(store)


def test_points_thinned_before_they_were_sent_arrive_as_their_outline_after_the_last_sent():
    store = SeriesStore()
    store._series["train/loss"] = Series(limit=1024)
    stream = PointStream(max_new=10_000)
    for i in range(100):
        store.add(i, 0.0, {"train/loss": 1.0})
    stream.take(store)
    for i in range(100, 3_000):  # not taken while more than half the limit was thinned
        store.add(i, 0.0, {"train/loss": 50.0 if i == 1_234 else 1.0})
    chunk = stream.take(store)
    steps, values = unpack(chunk.keys, chunk.counts, chunk.buffer)["train/loss"]
    assert steps[0] >= 100 and steps[-1] == 2_999  # nothing sent twice, the newest exact
    assert (np.diff(steps) > 0).all() and 1_234 in steps[values == 50.0].tolist()
    assert not stream.shrank(store)
