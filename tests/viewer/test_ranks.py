"""Distributed runs in the viewer: rank listing, merged series, cross-rank alerts, memory."""

import json
import os
import socket
import time
import urllib.parse

import numpy as np
import pytest

from msmon_nb.events.index import RunIndex
from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter
from msmon_nb.metrics.decimate import downsample_band
from msmon_nb.rundir import ALERTS, MARKER, write_marker
from msmon_nb.viewer.rankmerge import RankedRun, merge_ranks
from msmon_nb.viewer.store import RunStore
from tests.support.synth import write_ranked_run

DEAD_PID = 2**22 + 1  # above pid_max's default: never a live process


def q(**params) -> str:
    return "?" + urllib.parse.urlencode(params)


def straggler_job(run_dir):
    """Rank 0 finished at step 99; rank 1 slow from step 20 and dead after step 39."""
    s0, s1 = np.arange(100), np.arange(40)
    return write_ranked_run(
        run_dir,
        {
            0: {
                "train/loss": 1 / (1 + s0),
                "train/step_time": np.full(100, 0.1),
                "train/grad_norm": np.ones(100),
            },
            1: {
                "train/loss": 1 / (1 + s1),
                "train/step_time": np.where(s1 >= 20, 0.5, 0.1),
                "train/grad_norm": np.ones(40),
            },
        },
        status={1: "running"},
        pid=DEAD_PID,
    )


def wait_until(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := fn():
            return result
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_runs_list_ranks_last_steps_and_status_before_and_after_loading(tmp_path, serve):
    straggler_job(tmp_path / "job")
    with EventWriter(tmp_path / "single") as writer:
        writer.add_scalars(0, {"train/loss": 1.0})
    server, client = serve(tmp_path)
    expected = {
        "ranks": [0, 1],
        "rank_last_step": {"0": 99, "1": 39},
        "rank_status": {"0": "finished", "1": "interrupted"},
        "status": "interrupted",  # the most alarming rank's state, as Run.status
        "last_step": 99,
    }
    for loaded in (False, True):
        status, runs = client.json("/api/runs")
        assert status == 200 and [r["name"] for r in runs] == ["job", "single"]
        job, single = runs
        assert ("job" in server.store._loaded) is loaded  # listed by the index, then loaded
        assert {k: job[k] for k in expected} == expected
        assert single["ranks"] == [0] and single["rank_status"] == {}
        assert client.json("/api/scalars" + q(run="job", tag="train/loss"))[0] == 200
    run = load_run(tmp_path / "job")  # the library agrees
    assert run.rank_last_step() == {0: 99, 1: 39}
    assert run.rank_status() == {0: "finished", 1: "interrupted"}


def test_rank_query_serves_each_rank_and_unknown_rank_is_404(tmp_path, serve):
    straggler_job(tmp_path / "job")
    _, client = serve(tmp_path)
    for rank, n in ((0, 100), (1, 40)):
        status, body = client.json("/api/scalars" + q(run="job", tag="train/step_time", rank=rank))
        assert status == 200 and body["rank"] == rank and body["last_step"] == n - 1
        assert body["steps"] == list(range(n)) and body["raw"] is True
    body = client.json("/api/scalars" + q(run="job", tag="train/step_time", rank=1))[1]
    assert body["values"][19:21] == [pytest.approx(0.1), 0.5]
    status, body = client.json("/api/scalars" + q(run="job", tag="train/loss", rank=7))
    assert status == 404 and "no rank 7" in body["error"]
    status, body = client.json("/api/scalars" + q(run="job", tag="nope", rank="all"))
    assert status == 404 and "no scalar tag 'nope'" in body["error"]


def test_merged_keeps_a_single_rank_spike_and_counts_ranks(tmp_path, serve):
    n, spike, nan_step = 20_000, 12_345, 777
    rng = np.random.default_rng(0)
    loss = {k: 1.0 + 0.01 * rng.standard_normal(n) for k in range(3)}
    loss[1][spike] = 40.0  # one rank, one step
    loss[2][nan_step] = np.nan
    write_ranked_run(
        tmp_path / "job",
        {
            0: {"train/loss": loss[0]},
            1: {"train/loss": loss[1]},
            2: {"train/loss": loss[2][:15_000]},
        },
    )
    _, client = serve(tmp_path)
    status, body = client.json("/api/scalars" + q(run="job", tag="train/loss", rank="all"))
    assert status == 200 and body["rank"] == "all"
    assert body["raw"] is False and body["count"] == n
    m = len(body["steps"])
    assert m <= 2 * 1000 and body["steps"] == sorted(body["steps"])
    assert len(body["values"]) == len(body["band_min"]) == len(body["band_max"]) == m
    assert len(body["rank_count"]) == m
    assert body["steps"][0] == 0 and body["steps"][-1] == n - 1
    # the spike of rank 1 survives in the band: max of maxes over its bucket, and the max
    assert body["max"] == 40.0 and max(v for v in body["band_max"] if v is not None) == 40.0
    i = body["steps"].index(spike)  # the mean's own spike is one of its bucket's extremes
    f32 = [np.float32(loss[k][spike]).astype(np.float64) for k in range(3)]
    assert body["values"][i] == pytest.approx(sum(f32) / 3)
    assert body["band_max"][i] == 40.0
    # rank 2 wrote 15,000 steps: two ranks after that, three before
    counts = dict(zip(body["steps"], body["rank_count"], strict=True))
    assert {c for s, c in counts.items() if s >= 15_100} == {2}
    assert {c for s, c in counts.items() if s < 14_900} == {3}
    # rank 2's NaN makes the mean NaN there (marked), the band stays finite
    assert body["nonfinite"] == {"steps": [nan_step], "kinds": ["nan"]}
    j = body["steps"].index(nan_step)
    assert body["values"][j] is None and body["band_min"][j] is not None

    # a zoomed range is raw: the exact mean, min, max and count per step
    status, raw = client.json(
        "/api/scalars" + q(run="job", tag="train/loss", rank="all", start=14_990, end=15_009)
    )
    assert raw["raw"] is True and raw["steps"] == list(range(14_990, 15_010))
    cols = [np.asarray(loss[k], np.float32).astype(np.float64) for k in range(3)]
    for step, mean, lo, hi, count in zip(
        raw["steps"],
        raw["values"],
        raw["band_min"],
        raw["band_max"],
        raw["rank_count"],
        strict=True,
    ):
        vals = [c[step] for c in cols[: 3 if step < 15_000 else 2]]
        assert (mean, lo, hi, count) == (
            pytest.approx(np.mean(vals)),
            min(vals),
            max(vals),
            len(vals),
        )


def test_merge_ranks_over_misaligned_steps_exactly():
    class S:
        def __init__(self, steps, values):
            self.steps, self.values = np.array(steps), np.array(values, np.float32)

    merged = merge_ranks([S([0, 2, 4], [1, 2, 3]), S([1, 2, 3, 4], [10, np.nan, 30, np.inf])])
    assert merged.steps.tolist() == [0, 1, 2, 3, 4]
    assert merged.count.tolist() == [1, 1, 2, 1, 2]
    assert merged.mean.tolist()[:2] == [1.0, 10.0] and np.isnan(merged.mean[2])
    assert merged.mean[3] == 30.0 and merged.mean[4] == np.inf
    assert merged.min.tolist() == [1, 10, 2, 30, 3]  # finite values only
    assert merged.max.tolist() == [1, 10, 2, 30, 3]
    aligned = merge_ranks([S([0, 1], [1, 5]), S([0, 1], [3, -5])])
    assert aligned.mean.tolist() == [2.0, 0.0] and aligned.min.tolist() == [1.0, -5.0]
    with pytest.raises(ValueError):
        merge_ranks([])


def test_downsample_band_takes_min_of_mins_and_max_of_maxes_per_bucket():
    n = 10_000
    steps = np.arange(n)
    mean = np.zeros(n)
    low, high = np.full(n, -1.0), np.full(n, 1.0)
    high[5_000], low[7_000] = 9.0, -9.0
    low[8_000:8_010] = np.nan  # no rank had a finite value there
    count = np.full(n, 4)
    count[9_000] = 3
    band = downsample_band(steps, mean, low, high, count, max_points=100)
    assert not band.raw and band.n == n and len(band.steps) <= 100
    size = -(-n // 49)  # (100 - 2) // 2 buckets
    for s, lo, hi, c in zip(band.steps, band.low, band.high, band.count, strict=True):
        bucket = slice(s // size * size, s // size * size + size)
        assert hi == high[bucket].max() and lo == np.nanmin(low[bucket])
        assert c == count[bucket].min()
    assert band.high.max() == 9.0 and band.low.min() == -9.0 and 3 in band.count.tolist()
    small = downsample_band(steps[:10], mean[:10], low[:10], high[:10], count[:10], 100)
    assert small.raw and small.steps.tolist() == list(range(10))


def test_alerts_merge_own_and_cross_rank_each_with_its_rank(tmp_path, serve):
    run_dir = straggler_job(tmp_path / "job")
    own = {
        "step": 5, "since_step": 5, "kind": "nonfinite", "severity": "critical",
        "message": "train/loss is NaN at step 5", "tag": "train/loss", "value": float("nan"),
    }  # fmt: skip
    (run_dir / "rank_0" / ALERTS).write_text(json.dumps(own) + "\n")  # rank from the dir
    server, client = serve(tmp_path)
    status, alerts = client.json("/api/alerts" + q(run="job"))
    assert status == 200
    by_kind = {a["kind"]: a for a in alerts}
    assert set(by_kind) == {"nonfinite", "straggler", "rank_stopped"}
    assert by_kind["nonfinite"]["rank"] == 0 and "cross_rank" not in by_kind["nonfinite"]
    assert by_kind["nonfinite"]["value"] == "nan"
    straggler, stopped = by_kind["straggler"], by_kind["rank_stopped"]
    assert straggler["cross_rank"] is True and straggler["rank"] == 1
    assert straggler["since_step"] == 20 and straggler["tag"] == "train/step_time"
    assert stopped["cross_rank"] is True and stopped["rank"] == 1 and stopped["since_step"] == 40
    assert [a["step"] for a in alerts] == sorted(a["step"] for a in alerts)
    # the API stamps the chart an alert marks (its tag; a rank_stopped marks every chart)
    assert straggler.pop("chart") == "train/step_time" and stopped.pop("chart") is None
    assert server.store.cross_rank.get("job") == [straggler, stopped]


def test_cross_rank_alerts_follow_a_live_job_and_raise_an_event(tmp_path):
    """Rank 1 dies (its marker keeps saying running) while rank 0 goes on."""
    run_dir = tmp_path / "job"
    store = RunStore(tmp_path)
    writers = {k: EventWriter(run_dir / f"rank_{k}", rank=k, flush_secs=0.05) for k in (0, 1)}
    try:
        for k in (0, 1):
            marker = {"status": "running", "rank": k, "ranks": 2, "pid": os.getpid()}
            write_marker(run_dir / f"rank_{k}", dict(marker, host=socket.gethostname()))
        for step in range(10):
            for writer in writers.values():
                writer.add_scalars(step, {"train/loss": 1.0, "train/step_time": 0.1})
        for writer in writers.values():
            writer.flush()
        store.poll()
        assert store.alerts("job") == []  # both alive, in step
        run = store.run("job").run
        assert isinstance(run, RankedRun) and run.rank_status() == {0: "running", 1: "running"}
        # rank 1's process is gone: its marker names a dead pid now, no file changes
        marker = json.loads((run_dir / "rank_1" / MARKER).read_text())
        write_marker(run_dir / "rank_1", dict(marker, pid=DEAD_PID))
        for step in range(10, 30):
            writers[0].add_scalars(step, {"train/loss": 1.0, "train/step_time": 0.1})
        writers[0].flush()
        events = []

        def stopped_seen():
            events.extend(store.poll())
            return [a for a in store.alerts("job") if a["kind"] == "rank_stopped"]

        (alert,) = wait_until(stopped_seen)
        assert alert["rank"] == 1 and alert["since_step"] == 10 and alert["cross_rank"] is True
        wait_until(lambda: events.extend(store.poll()) or ("alerts", {"run": "job"}) in events)
        assert ("runs", {"names": ["job"]}) in events  # rank 1's status changed
        assert run.rank_status() == {0: "running", 1: "interrupted"}
        assert run.rank_last_step() == {0: 29, 1: 9}
    finally:
        for writer in writers.values():
            writer.close()
        store.close()


def test_done_ranks_are_compact_share_steps_and_reload_when_changed(tmp_path):
    n = 5_000
    cols = {"train/loss": np.linspace(1, 0, n), "train/lr": np.full(n, 1e-3)}
    write_ranked_run(tmp_path / "job", {0: cols, 1: cols, 2: cols})
    run = RankedRun(tmp_path / "job")
    assert run.refresh() is True and run.ranks == [0, 1, 2]
    states = [run._ranks[k] for k in run.ranks]
    assert all(s.run is None for s in states)  # finished: the Run was dropped
    steps = [run.scalars(t, rank=k).steps for k in run.ranks for t in cols]
    assert all(s is steps[0] for s in steps)  # one steps array for 3 ranks x 2 tags
    assert run.scalars("train/loss", rank=2).values.dtype == np.float32
    assert run.refresh() is False  # nothing changed: nothing read
    # rank 1 is resumed (a restart appends to its dir): re-read, still compact once done
    with EventWriter(tmp_path / "job" / "rank_1", rank=1) as writer:
        writer.add_scalars(n, {"train/loss": -1.0, "train/lr": 1e-3})
    assert run.refresh() is True
    assert run.rank_last_step() == {0: n - 1, 1: n, 2: n - 1}
    assert run.scalars("train/loss", rank=1).values[-1] == -1.0
    assert run._ranks[1].run is None and run.scalars("train/loss", rank=0).steps is steps[0]


def test_job_dir_with_only_rank_markers_lists_as_the_job(tmp_path):
    for k in (0, 1):  # msrun started, no rank has flushed a summary file yet
        (tmp_path / "job" / f"rank_{k}").mkdir(parents=True)
        write_marker(tmp_path / "job" / f"rank_{k}", {"status": "running", "rank": k, "ranks": 2})
    (info,) = RunIndex(tmp_path).scan()
    assert info.name == "job" and info.ranks == (0, 1)
    with EventWriter(tmp_path / "job" / "rank_0", rank=0) as writer:
        writer.add_scalars(3, {"train/loss": 1.0})
    (info,) = RunIndex(tmp_path).scan()
    assert info.name == "job" and info.rank_last_step == {0: 3, 1: None}
    # a dir named rank_<k> holding a single-process run stays a run of its own
    (tmp_path / "other" / "rank_0").mkdir(parents=True)
    write_marker(tmp_path / "other" / "rank_0", {"status": "running", "rank": 0, "ranks": 1})
    names = [i.name for i in RunIndex(tmp_path).scan()]
    assert names == ["job", "other/rank_0"]
