"""Interop with a real peer: MindInsight 2.3.1 lists our runs and serves our values.

MindInsight runs from a venv of its own (``tests/viewer/mindinsight.py``), installed on first
use; that install takes minutes on a fresh machine, hence ``slow`` (still run by CI).
"""

import json
import time

import numpy as np
import pytest

from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import ALERTS, MARKER
from tests.support.mindinsight import MindInsight


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_mindinsight_lists_our_runs_and_serves_our_scalars(tmp_path):
    base = tmp_path / "summary"
    rng = np.random.default_rng(7)
    written = {}
    for name, steps in (("run_a", 40), ("run_b", 25)):
        loss = rng.random(steps).astype(np.float32)
        with EventWriter(base / name) as writer:
            for step in range(steps):
                writer.add_scalars(step, {"train/loss": float(loss[step]), "train/lr": 0.01})
            writer.add_histogram("train/weights", rng.normal(size=100), step=steps - 1)
        (base / name / MARKER).write_text(json.dumps({"status": "finished"}))
        (base / name / ALERTS).write_text("")
        written[name] = loss
    with MindInsight(base, tmp_path / "workspace") as mi:
        deadline = time.monotonic() + 120
        jobs = {}
        while time.monotonic() < deadline:
            listing = mi.train_jobs()
            jobs = {j["train_id"]: j for j in listing.get("train_jobs", [])}
            if len(jobs) == 2 and all(j["plugins"]["scalar"] for j in jobs.values()):
                break
            time.sleep(1)
        assert sorted(jobs) == ["./run_a", "./run_b"]
        for job in jobs.values():
            assert sorted(job["plugins"]["scalar"]) == ["train/loss/scalar", "train/lr/scalar"]
            assert job["plugins"]["histogram"] == ["train/weights/histogram"]
        for name, loss in written.items():
            points = mi.scalars(f"./{name}", "train/loss")
            assert [p["step"] for p in points] == list(range(len(loss)))
            assert [p["value"] for p in points] == loss.astype(np.float64).tolist()
            lr = mi.scalars(f"./{name}", "train/lr")
            assert {p["value"] for p in lr} == {float(np.float32(0.01))}
