"""A real 2-worker data-parallel job under MindSpore's own launcher, msrun, on the CPU."""

import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from msmon_nb.diagnose.rankrules import rank_alerts
from msmon_nb.events.runs import load_runs
from msmon_nb.rundir import MARKER
from msmon_nb.viewer.api import ROUTES
from msmon_nb.viewer.store import RunStore

SCRIPT = Path(__file__).with_name("dp_train.py")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun(
    save_dir: Path, mode: str, steps: int, log_dir: Path, loop: str = "watch"
) -> subprocess.Popen:
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
        loop,
    ]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def job(tmp_path: Path, mode: str, steps: int, loop: str, during=None):
    """Run the job to its end; its one run, and each worker's log. ``during(runs_dir)``
    is called while the job runs (e.g. to send it a command)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    logs = tmp_path / "logs"
    proc = msrun(tmp_path / "runs", mode, steps, logs, loop)
    try:
        if during is not None:
            during(tmp_path / "runs")
        assert proc.wait(240) == 0, (logs / "worker_1.log").read_text()[-2000:]
    finally:
        stop(proc)
    (run,) = load_runs(tmp_path / "runs")
    assert run.ranks == [0, 1] and run.rank_status() == {0: "finished", 1: "finished"}
    texts = [(logs / f"worker_{r}.log").read_text() for r in (0, 1)]
    assert all("reducer restored: True" in t for t in texts)  # the class is as before
    return run, texts


def overloaded() -> bool:
    """The host runs more than twice as many busy processes as it has cores."""
    return os.getloadavg()[0] > 2 * (os.cpu_count() or 1)


def timing_job(tmp_path: Path, mode: str, steps: int, loop: str, check, during=None) -> None:
    """``check(run)`` on a job whose assertions depend on the ranks' timing.

    A straggler is a rank slower than the others, so a host overloaded by other work
    makes a healthy rank slow too (seen at load 8-15 on 2 cores: rank 0 stalled for 10
    steps in the middle of rank 1's straggle). On such a host a failed check is run once
    more on a fresh job, with a warning saying so; on a quiet host it fails at once."""
    for attempt in (1, 2):
        busy_before = overloaded()
        run, _ = job(tmp_path / f"attempt{attempt}", mode, steps, loop, during)
        try:
            check(run)
            return
        except AssertionError as exc:
            if attempt == 2 or not (busy_before or overloaded()):
                raise
            warnings.warn(
                f"timing check failed on an overloaded host (load {os.getloadavg()[0]:.1f} "
                f"on {os.cpu_count()} cores): {str(exc)[:300]}; running the job once more",
                stacklevel=2,
            )


def kinds(alerts, *names):
    return [(a.kind, a.rank, a.since_step) for a in alerts if a.kind in names]


def recorded(run, *names):
    """What rank 0 recorded while the job ran (its watcher) or at its close."""
    out = [(a["kind"], a["rank"], a["since_step"]) for a in run.alerts if a.get("cross_rank")]
    return [item for item in out if item[0] in names]


@pytest.mark.slow
def test_two_ranks_one_run_equal_grad_norms_and_a_straggler(tmp_path):
    # a loop under mon.watch(); rank 1 sleeps 150 ms in its batch generator from step 30
    def check(run):
        assert sorted(p.parent.name for p in run.files) == ["rank_0", "rank_1"]
        assert all(
            f".{rank}." in p.name
            for rank, p in zip((0, 1), sorted(run.files, key=lambda p: p.parent.name), strict=True)
        )
        g0, g1 = (run.scalars("train/grad_norm", rank=r) for r in (0, 1))
        assert g0.steps.tolist() == g1.steps.tolist() == list(range(60))
        np.testing.assert_allclose(g0.values, g1.values, rtol=1e-5)  # after the all-reduce
        merged = run.merged("train/loss")
        assert merged.steps.tolist() == list(range(60)) and merged.count.tolist() == [2] * 60
        l0, l1 = (run.scalars("train/loss", rank=r).values for r in (0, 1))
        np.testing.assert_allclose(merged.min, np.minimum(l0, l1))
        np.testing.assert_allclose(merged.mean, (l0.astype(np.float64) + l1) / 2)
        stragglers = [a for a in rank_alerts(run) if a.kind == "straggler"]
        assert [a.rank for a in stragglers] == [1], [a.message for a in stragglers]
        assert abs(stragglers[0].since_step - 30) <= 2  # near 30: host noise shifts it
        assert stragglers[0].tag == "train/comm_busy"  # watch() loops: the collective wait too
        assert not [a for a in rank_alerts(run) if a.kind in ("grad_norm_mismatch", "loss_spread")]
        # rank 0 found it while training (no collective: it read rank 1's files), recorded it
        found = [a for a in run.alerts if a.get("cross_rank")]
        assert [(a.kind, a.rank) for a in found] == [("straggler", 1)]
        assert abs(found[0].since_step - 30) <= 2

    timing_job(tmp_path, "straggle", 60, "watch", check)


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


def waits(run, rank, tag="train/comm_wait"):
    series = run.scalars(tag, rank=rank)
    return series.steps, series.values


@pytest.mark.slow
def test_straggler_sleeping_outside_the_framework_found_by_collective_wait(tmp_path):
    # explicit mon.step loop; rank 1 sleeps 150 ms at the top of each step from step 30,
    # outside any framework call: no data loader hook sees it, step_time is equal on both
    def check(run):
        assert "train/data_time" not in run.tags(rank=1)
        steps, w0 = waits(run, 0)
        _, w1 = waits(run, 1)
        assert steps.tolist() == list(range(60))
        late = steps >= 31
        assert np.median(w0[late]) > 0.1 > np.median(w1[late])  # rank 0 waits for rank 1
        b0, b1 = (waits(run, r, "train/comm_busy")[1][-20:] for r in (0, 1))
        assert np.median(b1) - np.median(b0) > 0.1  # rank 1 is the busy one
        alerts = rank_alerts(run)
        stragglers = [a for a in alerts if a.kind == "straggler"]
        assert [a.rank for a in stragglers] == [1], [a.message for a in stragglers]
        assert abs(stragglers[0].since_step - 30) <= 2  # near 30: host noise shifts it
        assert "rank 1 is a straggler since step" in stragglers[0].message
        assert [(k, r) for k, r, _ in recorded(run, "straggler")] == [("straggler", 1)]
        assert not kinds(alerts, "rank_grad_spike", "rank_loss_spike", "grad_norm_mismatch")

    timing_job(tmp_path, "straggle", 60, "step", check)


def ctl_checkpoint(runs: Path) -> subprocess.CompletedProcess:
    """``msmon ctl RUN checkpoint`` once both ranks' monitors opened the run (a command
    appended before a monitor opened it is not that monitor's)."""
    deadline = time.monotonic() + 120
    markers: list[Path] = []
    while len(markers) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        markers = sorted(runs.glob(f"*/rank_*/{MARKER}"))
    assert len(markers) == 2, markers
    run_dir = markers[0].parent.parent
    command = ["ctl", str(run_dir), "checkpoint", "--timeout", "60"]
    return subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", *command], capture_output=True, text=True, timeout=90
    )


def check_checkpoints(run, done: subprocess.CompletedProcess) -> None:
    """Each rank saved its own ``rank_<k>/checkpoints/step_<n>.ckpt`` (n: the step that
    rank had finished when it read the command), recorded it, and each file loads."""
    import mindspore as ms

    assert done.returncode == 0, done.stdout + done.stderr
    saved = {}
    for rank in (0, 1):
        [entry] = [i for i in run.interventions if i["rank"] == rank]
        assert (entry["what"], entry["who"], entry["ok"]) == ("checkpoint", "ctl", True), entry
        step = entry["step"]
        assert 0 <= step < 59  # mid-run: the loop went on after it
        path = run.path / f"rank_{rank}" / "checkpoints" / f"step_{step}.ckpt"
        assert Path(entry["path"]) == path and entry["bytes"] == path.stat().st_size > 0
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
        line = f"rank {rank}, step {step}: ok: checkpoint of step {step} saved: {path} ("
        assert line in done.stdout, done.stdout
        saved[rank] = (step, str(path), entry["bytes"])
    assert len(run.interventions) == 2
    listed = [(c["rank"], c["step"], c["path"], c["bytes"]) for c in run.checkpoints]
    assert sorted(listed) == [(r, *saved[r]) for r in (0, 1)]
    store = RunStore(run.path.parent)  # the viewer serves the same list, with the ranks
    store.scan()
    served = ROUTES["/api/checkpoints"](store, {"run": [run.name]})
    assert sorted((c["rank"], c["step"], c["path"], c["bytes"]) for c in served) == sorted(listed)
    loaded = {r: ms.load_checkpoint(saved[r][1]) for r in (0, 1)}
    weights = {"0.weight", "0.bias", "2.weight", "2.bias"}
    for params in loaded.values():
        assert weights | {"learning_rate"} <= set(params), sorted(params)
        assert params["0.weight"].shape == (16, 8) and params["2.bias"].shape == (3,)
    if saved[0][0] == saved[1][0]:  # the same step: data parallel keeps equal replicas
        for name in weights:
            assert np.array_equal(loaded[0][name].asnumpy(), loaded[1][name].asnumpy()), name


@pytest.mark.slow
def test_healthy_job_has_no_straggler_and_no_rank_spike_and_checkpoints_each_rank(tmp_path):
    sent: list[subprocess.CompletedProcess] = []  # this attempt's msmon ctl is the last

    def check(run):
        for rank in (0, 1):
            tags = run.tags(rank=rank)
            for tag in ("train/comm_wait", "train/comm_busy", "train/local_grad_norm"):
                assert tag in tags
            np.testing.assert_array_equal(
                run.scalars("train/local_loss", rank=rank).values,
                run.scalars("train/loss", rank=rank).values,
            )
        alerts = rank_alerts(run)
        assert not [a for a in alerts if a.kind != "rank_stopped"], [a.message for a in alerts]
        assert recorded(run, "straggler", "rank_grad_spike", "rank_loss_spike") == []
        check_checkpoints(run, sent[-1])

    # both ranks slow down from step 20 until each saved: the command lands mid-run
    timing_job(
        tmp_path,
        "healthy+checkpoint",
        60,
        "step",
        check,
        lambda runs: sent.append(ctl_checkpoint(runs)),
    )


@pytest.mark.slow
def test_outlier_batch_on_one_rank_named_with_its_step(tmp_path):
    # rank 1's batch at step 40 is unnormalised (x50) and mislabelled; after the
    # all-reduce both ranks see the same grad_norm spike, only the local norms differ
    run, _ = job(tmp_path, "outlier", 60, "step")
    g0, g1 = (run.scalars("train/grad_norm", rank=r).values for r in (0, 1))
    np.testing.assert_allclose(g0, g1, rtol=1e-5)
    local = {r: run.scalars("train/local_grad_norm", rank=r).values for r in (0, 1)}
    assert local[1][40] > 10 * np.median(local[1][20:40])
    assert local[0][40] < 3 * np.median(local[0][20:40])
    alerts = rank_alerts(run)
    assert kinds(alerts, "rank_grad_spike") == [("rank_grad_spike", 1, 40)]
    assert kinds(alerts, "rank_loss_spike") == [("rank_loss_spike", 1, 40)]
    (spike,) = [a for a in alerts if a.kind == "rank_grad_spike"]
    assert spike.message.startswith("grad_norm spike at step 40 (x")
    assert "came from rank 1: local norm x" in spike.message and "others normal" in spike.message
    assert recorded(run, "rank_grad_spike", "rank_loss_spike") == [
        ("rank_grad_spike", 1, 40),
        ("rank_loss_spike", 1, 40),
    ]
    assert not kinds(alerts, "straggler")


@pytest.mark.slow
def test_model_train_straggler_and_outlier_named(tmp_path):
    # Model.train in PyNative: TrainOneStepCell calls its grad_reducer
    # (DistributedGradReducer) from Python; rank 1 sleeps in a callback from step
    # 30 and reads an outlier batch at step 40 (MindSpore's numbering, from 1)
    def check(run):
        steps = run.scalars("train/comm_wait", rank=0).steps
        assert steps.tolist() == list(range(1, 61))
        alerts = rank_alerts(run)
        stragglers = [a for a in alerts if a.kind == "straggler"]
        assert [a.rank for a in stragglers] == [1], [a.message for a in stragglers]
        assert abs(stragglers[0].since_step - 30) <= 2  # near 30: host noise shifts it
        assert kinds(alerts, "rank_grad_spike") == [("rank_grad_spike", 1, 40)]
        found = [(k, r) for k, r, _ in recorded(run, "straggler", "rank_grad_spike")]
        assert sorted(found) == [("rank_grad_spike", 1), ("straggler", 1)]

    timing_job(tmp_path, "straggle+outlier", 60, "model", check)


@pytest.mark.slow
def test_graph_mode_warns_once_naming_what_it_cannot_see(tmp_path):
    run, texts = job(tmp_path, "healthy", 12, "graph")
    for rank, text in enumerate(texts):
        assert text.count("no nn.DistributedGradReducer call was seen from Python") == 1
        tags = run.tags(rank=rank)
        assert "train/comm_wait" not in tags and "train/local_grad_norm" not in tags
        assert "train/local_loss" in tags  # the rank's own loss is still there
