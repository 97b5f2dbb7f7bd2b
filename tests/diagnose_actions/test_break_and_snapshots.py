"""break_on and action: debug stop inside the user's loop; snapshots equal numpy's stats."""

import json
import subprocess
import sys

import numpy as np
import pytest

from msmon_nb.config import ConfigError, MonitorConfig
from msmon_nb.events.runs import load_run
from msmon_nb.expr import compile_expression
from msmon_nb.monitor import Monitor
from tests.conftest import ROOT

LOOP = r"""
import sys, numpy as np, mindspore as ms
from mindspore import nn
from msmon_nb.monitor import Monitor
ms.set_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 8)).astype(np.float32); y = (x[:, 0] > 0).astype(np.int32)
net = nn.SequentialCell([nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 2)])
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
opt = nn.SGD(net.trainable_params(), float(sys.argv[3]))
grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
with Monitor(MonitorConfig_from(sys.argv)) as mon, mon.watch():
    for step in range(20):
        loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        opt(grads)
        after_update = step  # the debugger lands here, in this loop
print("done", mon.status)
"""

PRELUDE = r"""
import json
from msmon_nb.config import MonitorConfig
def MonitorConfig_from(argv):
    return MonitorConfig.from_dict(json.loads(argv[2]) | {"save_dir": argv[1]})
"""


def drive(tmp_path, config: dict, commands: str, lr: float = 0.05):
    script = tmp_path.parent / f"{tmp_path.name}_train.py"
    script.write_text(PRELUDE + LOOP)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), json.dumps(config), str(lr)],
        input=commands,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"GLOG_v": "3", "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
    )
    return proc


def test_break_on_stops_in_the_users_loop_with_tensors_in_scope(tmp_path):
    proc = drive(
        tmp_path,
        {"break_on": "step == 7"},
        "p step\np after_update\np float(loss.asnumpy()) > 0\np len(grads)\nc\n",
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert "break_on 'step == 7' holds at step 7" in out
    assert "-> after_update = step" in out  # the user's own line, not ours
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "-> after_update = step" in line)
    # p step, p after_update (the previous step's), p loss > 0, p len(grads)
    assert lines[at + 1 : at + 5] == ["(Pdb) 7", "(Pdb) 6", "(Pdb) True", "(Pdb) 4"]
    assert "done finished" in out


def test_alert_action_debug_breaks_at_the_alert_step(tmp_path):
    config = {"alerts": {"grad_explosion": {"action": "debug"}}}
    # a learning rate that blows the model up within a few steps
    proc = drive(tmp_path, config, "p step\nc\n" * 5, lr=50.0)
    assert proc.returncode == 0, proc.stderr
    assert "grad_explosion" in proc.stdout
    assert "-> after_update = step" in proc.stdout
    (run_dir,) = tmp_path.iterdir()
    alerts = load_run(run_dir).alerts
    assert any(a["kind"] == "grad_explosion" for a in alerts)


def test_bad_break_on_is_a_config_error():
    with pytest.raises(ConfigError, match="break_on"):
        MonitorConfig(break_on="grad_norm >")
    with pytest.raises(ConfigError, match="only isnan"):
        MonitorConfig(break_on="open('x')")
    assert compile_expression("isnan(loss) or grad_norm > 1e4").evaluate(3, {"train/loss": np.nan})


def test_snapshot_stats_equal_numpy(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.normal(size=(80, 60)).astype(np.float32)  # 4,800 elements: over max_raw
    w[0, 0] = np.nan
    w[1, 1] = np.inf
    small = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        got = mon.snapshot({"fc1.weight": w, "bias": small})
    assert [g["name"] for g in got] == ["fc1.weight", "bias"]
    finite = w[np.isfinite(w)].astype(np.float64)
    stats = got[0]["stats"]
    assert stats["nan_count"] == 1 and stats["inf_count"] == 1
    assert stats["min"] == finite.min() and stats["max"] == finite.max()
    assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-12)
    run = load_run(mon.run_dir)
    (entry_w, entry_b) = run.snapshots
    assert entry_w["step"] == 0 and entry_w["shape"] == [80, 60]
    assert entry_w["histogram"].count == w.size
    assert entry_w["has_value"] is False and entry_b["has_value"] is True
    np.testing.assert_array_equal(run.snapshot_value("bias", 0), small)
    assert run.scalars("snap/fc1.weight/max").values[0] == np.float32(finite.max())


def test_mm_snapshot_finds_the_active_monitor(tmp_path):
    import msmon_nb as mm

    with pytest.raises(ConfigError, match="no monitor is active"):
        mm.snapshot({"a": np.ones(3)})
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        mm.snapshot({"a": np.ones(3)}, reason="console")
    assert load_run(mon.run_dir).snapshots[0]["reason"] == "console"


def test_flight_recorder_holds_the_steps_before_the_alert(tmp_path):
    import mindspore as ms

    rng = np.random.default_rng(9)
    weights = [rng.normal(size=(4, 5)).astype(np.float32) * (s + 1) for s in range(12)]
    grads = [rng.normal(size=(4, 5)).astype(np.float32) for _ in range(12)]
    param = ms.Parameter(ms.Tensor(weights[0]), name="fc.weight")
    cfg = MonitorConfig(
        save_dir=str(tmp_path),
        snapshot={"on": "alert", "keep": 5},
        alerts={"nonfinite": {"action": "snapshot"}},
    )
    with Monitor(cfg) as mon:
        for step in range(12):
            param.set_data(ms.Tensor(weights[step]))
            loss = float("nan") if step == 9 else 1.0 / (step + 1)
            mon.step(loss=loss, grads=[grads[step]], params=[param])
    run = load_run(mon.run_dir)
    kinds = [a["kind"] for a in run.alerts]
    assert "nonfinite" in kinds
    # live and on-disk alerts read alike: keys, attributes, the onset alias
    (live,) = [a for a in mon.alerts if a.kind == "nonfinite"]
    (disk,) = [a for a in run.alerts if a.kind == "nonfinite"]
    assert live.since_step == live.onset == live["since_step"] == disk.onset == 9
    assert disk.rule == live.rule == "nonfinite" and live["message"] == disk.message
    history = [s for s in run.snapshots if s["reason"].endswith(":history")]
    steps = sorted({s["step"] for s in history})
    assert steps == [5, 6, 7, 8, 9]  # the K = 5 collected steps up to the alert
    for entry in history:
        source = weights if entry["name"] == "fc.weight" else grads
        arr = source[entry["step"]].astype(np.float64)
        assert entry["stats"]["min"] == arr.min() and entry["stats"]["max"] == arr.max()
        assert entry["stats"]["mean"] == pytest.approx(arr.mean(), rel=1e-12)
        assert entry["stats"]["std"] == pytest.approx(arr.std(), rel=1e-12)
        assert entry["histogram"].count == arr.size
    assert {s["name"] for s in history} == {"fc.weight", "fc.weight.grad"}
