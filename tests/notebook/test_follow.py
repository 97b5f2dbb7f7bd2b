"""Attaching to runs written by other processes: tailing every rank, lines plus band."""

import os
import subprocess
import sys
import time

import numpy as np

from msmon_nb.events.runs import load_run
from msmon_nb.notebook.follow import Follower, run_series
from msmon_nb.notebook.updates import unpack
from tests.conftest import ROOT

WRITER = r"""
import json, os, socket, sys, time
from msmon_nb.events.writer import EventWriter
run, rank, steps, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rank_dir = os.path.join(run, f"rank_{rank}")
os.makedirs(rank_dir, exist_ok=True)
marker = {"status": "running", "pid": os.getpid(), "host": socket.gethostname(),
          "rank": rank, "ranks": 2}
open(os.path.join(rank_dir, "msmon_run.json"), "w").write(json.dumps(marker))
with EventWriter(rank_dir, rank=rank, flush_secs=0.05) as w:
    for step in range(steps):
        w.add_scalars(step, {"train/loss": 1.0 / (step + 1) + 0.1 * rank, "train/grad_norm": 2.0})
        time.sleep(delay)
marker["status"] = "finished"
open(os.path.join(rank_dir, "msmon_run.json"), "w").write(json.dumps(marker))
"""


def test_follow_tails_every_rank_with_lines_and_band(tmp_path):
    run_dir = tmp_path / "job"
    env = dict(os.environ, GLOG_v="3")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(run_dir), str(rank), "150", "0.02"],
            cwd=ROOT,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 30
        while not (run_dir / "rank_1").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        follower = Follower(load_run(run_dir), interval=0.2)
        sent = []  # what the page would receive: every message the widget sends
        follower.panel.widget.send = lambda msg, buffers=None: sent.append((msg, buffers))
        follower.start()
        first = follower.run.rank_last_step()
        time.sleep(1.5)
        assert follower.updates >= 3, "the thread should redraw while the run grows"
        later = follower.run.rank_last_step()
        assert later[0] > first[0] and later[1] > first[1]
        keys = {key for msg, _ in sent for key in msg["keys"]}
        assert {"train/loss@rank0", "train/loss@rank1", "train/loss@min"} <= keys
        steps_sent = [
            unpack(msg["keys"], msg["counts"], buffers[0])["train/loss@rank1"][0]
            for msg, buffers in sent
            if "train/loss@rank1" in msg["keys"]
        ]
        assert np.concatenate(steps_sent).max() >= later[1] - 1
    finally:
        for proc in procs:
            proc.wait(60)
    follower.thread.join(10)
    assert not follower.thread.is_alive(), "following stops once every rank finished"
    run = load_run(run_dir)
    series, _alerts = run_series(run)
    assert {"train/loss@rank0", "train/loss@rank1", "train/loss@min", "train/loss@max"} <= set(
        series
    )
    band_min = series["train/loss@min"].values
    np.testing.assert_allclose(
        band_min,
        np.minimum(
            run.scalars("train/loss", rank=0).values, run.scalars("train/loss", rank=1).values
        ),
        rtol=1e-6,
    )
    assert follower.panel.state == "finished"
    assert sent[-1][0]["status"]["state"] == "finished"
