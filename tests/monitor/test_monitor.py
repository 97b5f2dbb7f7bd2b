"""Monitor: explicit steps, run dirs and markers, exit paths, outputs and faults."""

import json
import math
import os
import subprocess
import warnings

import mindspore as ms
import numpy as np
import pytest
import yaml

from msmon_nb.config import ConfigError, MonitorConfig
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor, StopTraining
from tests.support import tiny


def test_explicit_steps_accept_tensors_numpy_and_numbers(tmp_path):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
    expected = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(
            loss=ms.Tensor(np.float32(2.5)),
            grads=[ms.Tensor(g) for g in grads],
            lr=0.1,
            batch_size=8,
        )
        mon.step(loss=np.float32(2.0), grads=grads, lr=ms.Tensor(np.float32(0.05)), batch_size=8)
        mon.step(loss=1.5, grad_norm=3.0, lr=np.array(0.01), batch_size=8)
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").values.tolist() == [2.5, 2.0, 1.5]
    np.testing.assert_allclose(
        run.scalars("train/grad_norm").values, [expected, expected, 3.0], rtol=1e-5
    )
    np.testing.assert_allclose(
        run.scalars("train/learning_rate").values, [0.1, 0.05, 0.01], rtol=1e-6
    )
    assert run.scalars("train/throughput").steps.tolist() == [0, 1, 2]


def test_marker_and_config_backup(tmp_path):
    source = tmp_path / "cfg.yaml"
    source.write_text(f"monitor_config:\n  save_dir: {tmp_path / 'runs'}\n  log_interval: 3\n")
    with Monitor(MonitorConfig.from_yaml(source)) as mon:
        marker = json.loads((mon.run_dir / "msmon_run.json").read_text())
        assert marker["status"] == "running"
        mon.step(loss=1.0)
    marker = json.loads((mon.run_dir / "msmon_run.json").read_text())
    assert marker["status"] == "finished"
    assert marker["pid"] == os.getpid()
    assert marker["mindspore"] == ms.__version__
    assert marker["device"] == "CPU"
    for key in ("msmon_nb", "python", "host", "start", "end"):
        assert marker[key]
    assert marker["config"]["log_interval"] == 3
    backup = yaml.safe_load((mon.run_dir / "config_backup" / "monitor_config.yaml").read_text())
    assert backup["monitor_config"]["log_interval"] == 3
    assert (mon.run_dir / "config_backup" / "source_cfg.yaml").read_text() == source.read_text()


def test_run_names_unique_and_collisions_suffixed(tmp_path):
    with (
        Monitor(save_dir=str(tmp_path), model_name="mlp") as a,
        Monitor(save_dir=str(tmp_path), model_name="mlp") as b,
    ):
        assert a.run_dir != b.run_dir
        assert a.run_name.startswith("mlp_")
    with Monitor(save_dir=str(tmp_path), run_name="exp1") as c:
        c.step(loss=1.0)
    with (
        pytest.warns(MonitorWarning, match="already exists"),
        Monitor(save_dir=str(tmp_path), run_name="exp1") as d,
    ):
        d.step(loss=2.0)
    assert d.run_dir.name == "exp1.2"
    assert load_run(c.run_dir).scalars("train/loss").values.tolist() == [1.0]  # never mixed
    assert load_run(d.run_dir).scalars("train/loss").values.tolist() == [2.0]


def test_exception_marks_interrupted_and_keeps_records(tmp_path):
    with pytest.raises(ValueError, match="boom"), Monitor(save_dir=str(tmp_path)) as mon:
        for i in range(5):
            mon.step(loss=float(i))
        raise ValueError("boom")
    run = load_run(mon.run_dir)
    assert run.status == "interrupted"
    assert run.scalars("train/loss").steps.tolist() == [0, 1, 2, 3, 4]


def test_keyboard_interrupt_marks_interrupted(tmp_path, python):
    proc = python(
        "import sys\nfrom msmon_nb.monitor import Monitor\n"
        "with Monitor(save_dir=sys.argv[1]) as mon:\n"
        "    for i in range(100):\n"
        "        mon.step(loss=float(i))\n"
        "        if i == 41: raise KeyboardInterrupt\n",
        str(tmp_path),
        check=False,
    )
    assert "KeyboardInterrupt" in proc.stderr
    (run_dir,) = tmp_path.iterdir()
    run = load_run(run_dir)
    assert run.status == "interrupted"
    assert run.scalars("train/loss").steps.tolist() == list(range(42))


def test_unclosed_monitor_at_exit(tmp_path, python):
    python(
        "import sys\nfrom msmon_nb.monitor import Monitor\n"
        "mon = Monitor(save_dir=sys.argv[1])\nfor i in range(7): mon.step(loss=1.0)\n",
        str(tmp_path),
    )
    (run_dir,) = tmp_path.iterdir()
    assert load_run(run_dir).status == "finished"
    crashed = tmp_path / "crash"
    python(
        "import sys\nfrom msmon_nb.monitor import Monitor\n"
        "mon = Monitor(save_dir=sys.argv[1])\nmon.step(loss=1.0)\nraise SystemError('x')\n",
        str(crashed),
        check=False,
    )
    (run_dir,) = crashed.iterdir()
    assert load_run(run_dir).status == "interrupted"


def test_stop_in_explicit_loop(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        for i in range(100):
            mon.step(loss=1.0)
            if i == 9:
                mon.stop()
        pytest.fail("StopTraining should have ended the loop")  # pragma: no cover
    assert load_run(mon.run_dir).status == "stopped"
    assert issubclass(StopTraining, BaseException) and not issubclass(StopTraining, Exception)


def test_extra_metrics_and_log(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0, **{"train/tokens_per_s": 1000.0})
        mon.log({"val/f1": 0.81})
        with pytest.raises(ConfigError, match="tag rule"):
            mon.log({"Val F1": 0.5})
    run = load_run(mon.run_dir)
    assert run.scalars("val/f1").values.tolist() == [pytest.approx(0.81)]
    assert run.scalars("train/tokens_per_s").values.tolist() == [1000.0]


def test_param_stats_and_system(tmp_path):
    net = tiny.mlp()
    params = net.trainable_params()
    grads = [np.ones(p.shape, np.float32) for p in params]
    cfg = MonitorConfig(
        save_dir=str(tmp_path),
        track_metrics=["loss", "grad_norm", "param_stats", "system"],
        param_targets=[r"^0\."],
    )
    with Monitor(cfg) as mon:
        mon.step(loss=1.0, grads=grads, params=params)
    tags = load_run(mon.run_dir).tags()
    name0 = params[0].name
    assert f"param/{name0}/grad_norm" in tags and f"param/{name0}/weight_norm" in tags
    assert not any(t.startswith("param/2.") for t in tags)  # filtered by the regex
    assert {"sys/rss_mb", "sys/cpu_percent", "sys/host_mem_percent"} <= set(tags)
    got = load_run(mon.run_dir).scalars(f"param/{name0}/grad_norm").values[0]
    assert got == pytest.approx(math.sqrt(params[0].size))


def test_disabled_monitor_writes_nothing(tmp_path):
    with Monitor(save_dir=str(tmp_path / "x"), enable_monitor=False) as mon:
        mon.step(loss=1.0)
    assert mon.run_dir is None and not (tmp_path / "x").exists()


def test_file_and_tensorboard_outputs(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Monitor(save_dir=str(tmp_path), monitor_type=["summary", "file", "tensorboard"]) as mon:
        for i in range(5):
            mon.step(loss=1.0 / (i + 1), grad_norm=float("nan") if i == 3 else 2.0)
    rows = [
        json.loads(line) for line in (mon.run_dir / "metrics.rank0.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == list(range(5))
    assert float(rows[3]["train/grad_norm"]) != float(rows[3]["train/grad_norm"])  # NaN kept
    acc = EventAccumulator(str(mon.run_dir / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == list(range(5))
    np.testing.assert_allclose(
        [e.value for e in events], [1.0 / (i + 1) for i in range(5)], rtol=1e-6
    )


def test_mlflow_output_with_real_client(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    with Monitor(
        save_dir=str(tmp_path), monitor_type=["summary", "mlflow"], project_name="proj"
    ) as mon:
        for i in range(4):
            mon.step(loss=float(i))
    uri = (tmp_path / "mlruns").resolve().as_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(i, float(i)) for i in range(4)]
    assert run.info.run_name == mon.run_dir.name


def _mount_tmpfs(path, size):
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
        ).returncode
        == 0
    )


def test_disk_full_training_completes_with_one_warning(tmp_path):
    mnt = tmp_path / "full"
    if not _mount_tmpfs(mnt, "96k"):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tracked = [*MonitorConfig().track_metrics, "system"]
            with Monitor(save_dir=str(mnt), track_metrics=tracked) as mon:
                steps = list(_train_watched(mon, 400))
        assert steps[-1] == 400
        ours = [w for w in caught if issubclass(w.category, MonitorWarning)]
        assert len(ours) == 1, [str(w.message) for w in ours]
        assert "No space left" in str(ours[0].message)
        assert len(mon.series["train/loss"]) == 400  # the live view kept everything
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _train_watched(mon, steps):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = ms.nn.SGD(net.trainable_params(), 0.05)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    done = 0
    with mon.watch():
        for a, b in tiny.batches(x, y, steps=steps):
            _, grads = grad_fn(a, b)
            opt(grads)
            done += 1
            yield done


def _read_only(path):
    """Make ``path`` read-only for real: a read-only tmpfs for root, mode bits otherwise."""
    if os.geteuid() == 0:
        return subprocess.run(["mount", "-o", "remount,ro", str(path)]).returncode == 0
    path.chmod(0o500)
    return True


def test_read_only_save_dir_training_completes_with_one_warning(tmp_path):
    ro = tmp_path / "ro"
    if os.geteuid() == 0 and not _mount_tmpfs(ro, "1m"):
        pytest.skip("cannot mount a tmpfs")
    ro.mkdir(exist_ok=True)
    try:
        assert _read_only(ro)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Monitor(save_dir=str(ro)) as mon:
                steps = list(_train_watched(mon, 30))
        assert steps[-1] == 30
        ours = [w for w in caught if issubclass(w.category, MonitorWarning)]
        assert len(ours) == 1 and "read-only" in str(ours[0].message).lower()
        assert mon.run_dir is None
        assert len(mon.series["train/loss"]) == 30  # the live view still works
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)


def test_throughput_brings_step_time(tmp_path):
    """The DESIGN core list has no step_time; throughput implies it (it is its divisor)."""
    cfg = MonitorConfig(save_dir=str(tmp_path), track_metrics=["loss", "grad_norm", "throughput"])
    with Monitor(cfg) as mon:
        for _ in range(3):
            mon.step(loss=1.0, grad_norm=2.0, batch_size=4)
    run = load_run(mon.run_dir)
    step_time = run.scalars("train/step_time").values
    throughput = run.scalars("train/throughput").values
    assert len(step_time) == 3
    np.testing.assert_allclose(throughput, 4 / step_time, rtol=1e-4)
    lean = MonitorConfig(save_dir=str(tmp_path), track_metrics=["loss"])
    assert not lean.tracks("step_time")
