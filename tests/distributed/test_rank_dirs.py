"""Rank awareness without a launcher: msrun's environment alone puts ranks in one run."""

import os
import subprocess
import sys

import numpy as np

from msmon_nb.events.runs import load_runs
from tests.conftest import ROOT

WORKER = """
import sys
from msmon_nb.monitor import Monitor
with Monitor(save_dir=sys.argv[1], model_name="job") as mon:
    for step in range(5):
        mon.step(loss=1.0 + int(sys.argv[2]), grad_norm=2.0)
print(mon.run_dir, mon.write_dir)
"""


def launch(base, rank, port):
    env = dict(os.environ, RANK_ID=str(rank), RANK_SIZE="2", MS_SCHED_PORT=str(port), GLOG_v="3")
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(base), str(rank)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_ranks_of_one_job_share_a_run_and_a_reused_name_moves_on_together(tmp_path):
    outs = []
    for _attempt in range(2):  # the second job reuses the same name (same parent, same port)
        procs = [launch(tmp_path, rank, 4242) for rank in (0, 1)]
        outs.append([p.communicate(timeout=120)[0].split() for p in procs])
        assert all(p.returncode == 0 for p in procs)
    (run0_a, dir0_a), (run1_a, dir1_a) = outs[0]
    (run0_b, _), (run1_b, _) = outs[1]
    assert run0_a == run1_a and run0_b == run1_b and run0_a != run0_b
    assert run0_b.endswith(".2")
    assert dir0_a.endswith("rank_0") and dir1_a.endswith("rank_1")
    runs = load_runs(tmp_path)
    assert len(runs) == 2
    for run in runs:
        assert run.ranks == [0, 1]
        assert run.rank_status() == {0: "finished", 1: "finished"}
        assert [
            f".{r}." in p.name
            for r, p in zip((0, 1), sorted(run.files, key=lambda p: p.parent.name), strict=True)
        ] == [True, True]
        assert run.scalars("train/loss", rank=1).values.tolist() == [2.0] * 5
        assert run.merged("train/loss").mean.tolist() == [1.5] * 5


NAN_WORKER = """
import sys
from msmon_nb.monitor import Monitor
rank = int(sys.argv[2])
with Monitor(save_dir=sys.argv[1], model_name="nan") as mon:
    for step in range(5):
        mon.step(loss=float("nan") if (rank, step) == (1, 2) else 1.0 + rank)
"""


def test_one_nan_rank_keeps_the_band_and_run_and_viewer_merge_alike(tmp_path):
    """Issue 33: a rank's NaN makes the step's mean NaN but does not blank the band (min
    and max over the finite values), in ``Run.merged`` (the follow panel's band) exactly
    as in the viewer's merge."""
    from msmon_nb.viewer.rankmerge import RankedRun

    env = dict(os.environ, RANK_SIZE="2", MS_SCHED_PORT="4343", GLOG_v="3")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", NAN_WORKER, str(tmp_path), str(rank)],
            cwd=ROOT,
            env={**env, "RANK_ID": str(rank)},
        )
        for rank in (0, 1)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    (run,) = load_runs(tmp_path)
    merged = run.merged("train/loss")
    assert merged.steps.tolist() == [0, 1, 2, 3, 4]
    assert merged.count.tolist() == [2] * 5
    assert merged.min.tolist() == [1.0] * 5 and merged.max.tolist() == [2.0, 2.0, 1.0, 2.0, 2.0]
    assert [m != m for m in merged.mean.tolist()] == [False, False, True, False, False]
    ranked = RankedRun(run.path)
    ranked.refresh()
    viewer = ranked.merged("train/loss", exact=True)
    for ours, theirs in zip(
        (merged.steps, merged.mean, merged.min, merged.max, merged.count),
        (viewer.steps, viewer.mean, viewer.min, viewer.max, viewer.count),
        strict=True,
    ):
        np.testing.assert_array_equal(ours, theirs)  # NaN where the other has NaN
