"""A big finished distributed run served from its writers' overviews (events.overview).

Four ranks of 25,000 steps x 3 tags (75,000 scalars a rank: past OVERVIEW_MIN_SCALARS),
written by EventWriter as Monitor writes them under msrun. Rank 3 is a straggler from 40%
of the run on; rank 1 has a one-step grad_norm spike. What must hold: the merged chart is
answered without decoding any rank (no ``Run`` built), keeps rank 1's spike in the band,
says it is not raw, has the median line and names rank 3 as the outlier; a zoom decodes
and answers raw points; the cross-rank rules still find the straggler.
"""

import threading
import time
import urllib.parse

import numpy as np
import pytest

from msmon_nb.events.overview import read_overview
from msmon_nb.viewer import rankmerge
from msmon_nb.viewer.rankmerge import OVERVIEW_MIN_SCALARS, RankedRun
from tests.support.synth import write_ranked_run

RANKS, STEPS, SPIKE_STEP, SLOW_FROM = 4, 25_000, 12_345, 10_000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    base = tmp_path_factory.mktemp("ov")
    columns = {}
    for rank in range(RANKS):
        rng = np.random.default_rng(rank)
        s = np.arange(STEPS)
        grad = 1.0 + 0.1 * rng.standard_normal(STEPS)
        if rank == 1:
            grad[SPIKE_STEP] = 500.0
        step_time = 0.1 + 0.002 * rng.standard_normal(STEPS)
        if rank == 3:
            step_time[SLOW_FROM:] *= 2.5
        columns[rank] = {
            "train/loss": 2.0 * np.exp(-s / 5000) + 0.02 * rng.standard_normal(STEPS),
            "train/grad_norm": grad,
            "train/step_time": step_time,
        }
    write_ranked_run(base / "job", columns)
    assert 3 * STEPS >= OVERVIEW_MIN_SCALARS
    return base


def q(**kw) -> str:
    return "?" + urllib.parse.urlencode(kw)


def test_every_rank_left_a_complete_overview(big):
    for rank in range(RANKS):
        overview = read_overview(big / "job" / f"rank_{rank}")
        assert overview is not None and sorted(overview.tags) == [
            "train/grad_norm", "train/loss", "train/step_time",
        ]  # fmt: skip
        assert int(overview.tag_rows("train/loss")["n"].sum()) == STEPS


def test_merged_chart_from_the_overview_without_decoding(big, serve, monkeypatch):
    built = []  # ranks decoded outside the cross-rank rules' own thread
    real_run = rankmerge.Run

    def run(*a, **k):
        if threading.current_thread().name != "msmon-view-ranks":
            built.append(a)
        return real_run(*a, **k)

    monkeypatch.setattr(rankmerge, "Run", run)
    _, client = serve(big)
    status, body = client.json("/api/scalars" + q(run="job", tag="train/grad_norm", rank="all"))
    assert status == 200, body
    assert built == []  # no rank decoded for the chart
    assert body["raw"] is False and body["last_step"] == STEPS - 1
    assert body["steps"][0] == 0 and body["steps"][-1] == STEPS - 1
    assert set(body["rank_count"]) == {RANKS}
    assert max(v for v in body["band_max"] if v is not None) == 500.0  # rank 1's spike
    assert len(body["median"]) == len(body["steps"])
    assert 0.9 < np.nanmedian([v for v in body["median"] if v is not None]) < 1.1

    status, body = client.json("/api/scalars" + q(run="job", tag="train/step_time", rank="all"))
    assert [o["rank"] for o in body["outliers"]] == [3]
    slow = np.array([np.nan if v is None else v for v in body["outliers"][0]["values"]])
    steps = np.array(body["steps"])
    assert np.nanmedian(slow[steps > SLOW_FROM + 100]) == pytest.approx(0.25, rel=0.05)
    assert built == []


def test_a_zoom_decodes_and_answers_raw_points(big, serve):
    _, client = serve(big)
    query = q(run="job", tag="train/grad_norm", rank="all", start=SPIKE_STEP - 50,
              end=SPIKE_STEP + 50)  # fmt: skip
    status, body = client.json("/api/scalars" + query)
    assert status == 200 and body["raw"] is True
    assert body["steps"] == list(range(SPIKE_STEP - 50, SPIKE_STEP + 51))
    assert body["band_max"][50] == 500.0
    status, body = client.json(
        "/api/scalars" + q(run="job", tag="train/loss", rank=2, start=100, end=300)
    )
    assert body["raw"] is True and body["steps"] == list(range(100, 301))


def test_cross_rank_rules_still_find_the_straggler(big, serve):
    _, client = serve(big)
    client.json("/api/scalars" + q(run="job", tag="train/loss", rank="all"))
    deadline = time.monotonic() + 120
    found = []
    while time.monotonic() < deadline and not found:
        _, alerts = client.json("/api/alerts" + q(run="job"))
        found = [a for a in alerts if a.get("kind") == "straggler"]
        time.sleep(0.5)
    assert found and found[0]["rank"] == 3
    assert SLOW_FROM <= found[0]["since_step"] <= SLOW_FROM + 200


def test_a_rank_rewritten_after_its_overview_is_decoded(big, tmp_path):
    """An event file that changed after the writer closed (appended, here) voids the
    overview: the rank is decoded and every point served."""
    import shutil

    copy = tmp_path / "job"
    shutil.copytree(big / "job", copy)
    rank_dir = copy / "rank_0"
    (events,) = rank_dir.glob("*summary*")
    events.chmod(0o600)
    with open(events, "ab") as f:
        f.write(b"\0" * 16)  # a torn record: the reader skips it
    assert read_overview(rank_dir) is None
    run = RankedRun(copy)
    run.refresh()
    assert len(run.scalars("train/loss", rank=0).steps) == STEPS
    assert run.scalars("train/loss", rank=0).exact
    assert not run.scalars("train/loss", rank=1).exact  # the others keep their overview


def test_a_wide_job_of_small_ranks_is_served_from_the_overviews(tmp_path, monkeypatch):
    """1,024 ranks of 50,000 scalars each were every one decoded before the first merged
    chart (bench/long.py: ~60 s on a core); a job that holds many scalars in all is read
    from its overviews however small each rank, and a narrow one is still decoded."""
    steps = 2_000  # 4,000 scalars a rank: far below OVERVIEW_MIN_SCALARS
    for ranks in (2, 12):
        columns = {
            rank: {"train/loss": np.linspace(2, 1, steps), "train/step_time": np.full(steps, 0.1)}
            for rank in range(ranks)
        }
        write_ranked_run(tmp_path / f"job{ranks}", columns)
    # the job threshold scaled to this test's size: 12 x 4,000 scalars over it, 2 x not
    monkeypatch.setattr(rankmerge, "OVERVIEW_MIN_JOB_SCALARS", 40_000)
    wide, narrow = RankedRun(tmp_path / "job12"), RankedRun(tmp_path / "job2")
    wide.refresh()
    narrow.refresh()
    assert all(wide.overview_dir(k) is not None for k in range(12))
    assert all(narrow.overview_dir(k) is None for k in range(2))
    merged = wide.merged("train/loss")
    assert merged.exact is False and merged.steps[-1] == steps - 1
