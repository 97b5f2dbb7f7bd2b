"""Rank awareness without a launcher: msrun's environment alone puts ranks in one run."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from msmon_nb.events.runs import load_runs
from msmon_nb.rundir.control import acks
from tests.conftest import ROOT

WORKER = """
import sys
import time
from msmon_nb.monitor import Monitor
with Monitor(save_dir=sys.argv[1], model_name="job") as mon:
    for step in range(5):
        mon.step(loss=1.0 + int(sys.argv[2]), grad_norm=2.0)
print(mon.run_dir, mon.write_dir)
"""


def launch(base, rank, port, code=WORKER):
    """Rank ``rank`` of a 2-rank job as msrun's environment describes it, running ``code``."""
    env = dict(os.environ, RANK_ID=str(rank), RANK_SIZE="2", MS_SCHED_PORT=str(port), GLOG_v="3")
    return subprocess.Popen(
        [sys.executable, "-c", code, str(base), str(rank)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def reap(procs: list[subprocess.Popen]) -> None:
    """Wait for the ranks to end (a minute each at most), then kill what is left."""
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


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
import time
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

    procs = [launch(tmp_path, rank, 4343, NAN_WORKER) for rank in (0, 1)]
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


CTL_WORKER = """
import sys
import time
import time
from msmon_nb.monitor import Monitor
rank = int(sys.argv[2])
with Monitor(save_dir=sys.argv[1], model_name="ctl") as mon:
    print(mon.run_dir, flush=True)
    for step in range(100_000):
        mon.step(loss=1.0)
        if mon.stop_requested:
            break
        time.sleep(0.02 if rank == 0 else 2.0)  # rank 1: long steps
"""


def test_msmon_ctl_waits_for_every_live_rank_and_names_the_silent_one(tmp_path):
    """Issue 34: with several ranks, ``msmon ctl`` returned on the first rank's
    acknowledgement; it waits for each live rank, and when one stays silent past the
    timeout it says which (exit 1), the acks it did get printed."""
    procs = [launch(tmp_path, rank, 4444, CTL_WORKER) for rank in (0, 1)]
    try:
        run_dir = procs[0].stdout.readline().strip()
        assert procs[1].stdout.readline().strip() == run_dir
        time.sleep(3.0)  # both ranks' markers written and a step or two taken

        def ctl(*args):
            return subprocess.run(
                [sys.executable, "-m", "msmon_nb.cli", "ctl", run_dir, *args],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )

        short = ctl("freq", "2", "--timeout", "0.6")  # rank 1 is mid-step for ~2 s
        assert short.returncode == 1
        assert "rank 0, step" in short.stdout and "rank 1," not in short.stdout
        assert "freq 2 acknowledged by 1 of 2 ranks within 0.6 s" in short.stderr
        assert "still queued for rank 1," in short.stderr and "do not send it again" in short.stderr
        # ... and it was: rank 1 acts on it when its step ends, its ack in the run dir
        (queued_id,) = re.findall(r"id (\w+) in ", short.stderr)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(acks(Path(run_dir), queued_id)) < 2:
            time.sleep(0.1)
        assert {a["rank"] for a in acks(Path(run_dir), queued_id)} == {0, 1}
        done = ctl("stop", "--timeout", "30")
        assert done.returncode == 0, done.stderr
        assert "rank 0, step" in done.stdout and "rank 1, step" in done.stdout
    finally:
        reap(procs)


def test_msmon_ctl_stops_waiting_for_a_rank_whose_monitor_ended(tmp_path):
    """A rank that dies while ``msmon ctl`` waits never answers: ctl says so at once
    (within its liveness check, 1 s), not after --timeout, and names it (exit 1)."""
    procs = [launch(tmp_path, rank, 4545, CTL_WORKER) for rank in (0, 1)]
    try:
        run_dir = procs[0].stdout.readline().strip()
        assert procs[1].stdout.readline().strip() == run_dir
        time.sleep(3.0)  # both ranks' markers written, rank 1 in one of its 2 s steps
        started = time.monotonic()
        ctl = subprocess.Popen(
            [sys.executable, "-m", "msmon_nb.cli", "ctl", run_dir, "pause", "--timeout", "60"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(0.5)
        procs[1].send_signal(signal.SIGKILL)  # mid-step: it never reads the command
        procs[1].wait(10)  # reaped: its pid is gone, as a crashed rank's is
        out, err = ctl.communicate(timeout=60)
        took = time.monotonic() - started
        assert ctl.returncode == 1, err
        assert "rank 0, step" in out and "paused" in out and "rank 1," not in out
        assert "pause acknowledged by 1 of 2 ranks" in err
        assert "rank 1 ended without reading it" in err and "still queued" not in err
        assert took < 15, took  # not the 60 s timeout
        print(f"ctl returned {took:.1f} s after it was sent, rank 1 killed at 0.5 s")
        done = subprocess.run(
            [sys.executable, "-m", "msmon_nb.cli", "ctl", run_dir, "stop"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr  # rank 0, the one live rank, stops
    finally:
        reap(procs)
