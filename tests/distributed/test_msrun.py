"""A real 2-worker data-parallel job under MindSpore's own launcher, msrun, on the CPU."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from msmon_nb.diagnose.ranks import rank_alerts
from msmon_nb.events.runs import load_runs

SCRIPT = Path(__file__).with_name("dp_train.py")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun(save_dir: Path, mode: str, steps: int, log_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, GLOG_v="3", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    cmd = [
        str(BIN / "msrun"),
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--join=True",
        f"--log_dir={log_dir}",
        str(SCRIPT),
        str(save_dir),
        mode,
        str(steps),
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.mark.slow
def test_two_ranks_one_run_equal_grad_norms_and_a_straggler(tmp_path):
    proc = msrun(tmp_path / "runs", "straggle", 60, tmp_path / "logs")
    try:
        assert proc.wait(240) == 0, (tmp_path / "logs" / "worker_1.log").read_text()[-2000:]
    finally:
        stop(proc)
    (run,) = load_runs(tmp_path / "runs")  # both ranks landed in one run
    assert run.ranks == [0, 1]
    assert sorted(p.parent.name for p in run.files) == ["rank_0", "rank_1"]
    assert all(
        f".{rank}." in p.name
        for rank, p in zip((0, 1), sorted(run.files, key=lambda p: p.parent.name), strict=True)
    )
    assert run.rank_status() == {0: "finished", 1: "finished"}
    g0, g1 = (run.scalars("train/grad_norm", rank=r) for r in (0, 1))
    assert g0.steps.tolist() == g1.steps.tolist() == list(range(60))
    np.testing.assert_allclose(g0.values, g1.values, rtol=1e-5)  # after the all-reduce
    merged = run.merged("train/loss")
    assert merged.steps.tolist() == list(range(60)) and merged.count.tolist() == [2] * 60
    l0, l1 = (run.scalars("train/loss", rank=r).values for r in (0, 1))
    np.testing.assert_allclose(merged.min, np.minimum(l0, l1))
    np.testing.assert_allclose(merged.mean, (l0.astype(np.float64) + l1) / 2)
    stragglers = [a for a in rank_alerts(run) if a.kind == "straggler"]
    assert [a.rank for a in stragglers] == [1]
    assert 30 <= stragglers[0].since_step <= 32
    assert not [a for a in rank_alerts(run) if a.kind in ("grad_norm_mismatch", "loss_spread")]
    # rank 0 found it while training (no collective: it read rank 1's files) and recorded it
    recorded = [a for a in run.alerts if a.get("cross_rank")]
    assert [(a.kind, a.rank) for a in recorded] == [("straggler", 1)]
    assert 30 <= recorded[0].since_step <= 32


@pytest.mark.slow
def test_killed_rank_flagged_while_the_other_stays_readable(tmp_path):
    runs = tmp_path / "runs"
    proc = msrun(runs, "kill", 80, tmp_path / "logs")
    try:
        deadline = time.monotonic() + 240
        found = None
        while time.monotonic() < deadline and found is None:
            time.sleep(1.0)
            if not runs.is_dir():
                continue
            for run in load_runs(runs):
                status = run.rank_status()
                if status.get(1) == "interrupted":
                    found = (run, status)
        assert found is not None, "rank 1 was never seen gone"
        run, status = found
        stopped = [a for a in rank_alerts(run) if a.kind == "rank_stopped"]
        assert [a.rank for a in stopped] == [1]
        assert stopped[0].since_step <= 41
        last = run.rank_last_step()
        assert last[1] <= 40
        loss0 = run.scalars("train/loss", rank=0)  # rank 0's data: intact and readable
        assert loss0.steps.tolist() == list(range(len(loss0.steps)))
        assert len(loss0.steps) >= 35 and np.isfinite(loss0.values).all()
        assert run.problems == []
        # rank 0, stuck in the all-reduce, still records it from its watcher thread
        deadline = time.monotonic() + 30
        recorded = []
        while time.monotonic() < deadline and not recorded:
            recorded = [a for a in run.alerts if a.get("cross_rank")]
            time.sleep(0.5)
        assert [(a.kind, a.rank) for a in recorded] == [("rank_stopped", 1)]
    finally:
        stop(proc)
