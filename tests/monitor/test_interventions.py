"""Acting on a live run: ``checkpoint`` (restored into fresh objects, the run continues
bit-identically), ``lr xF`` (exact for constant and list lrs, refused with nothing changed
for a schedule cell), and every intervention recorded in the run's
``interventions.jsonl`` -- real tiny MindSpore nets on CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from msmon_nb.monitor.controls import interpret
from msmon_nb.rundir import INTERVENTIONS, read_jsonl
from msmon_nb.rundir.control import ControlError, check_command, send
from msmon_nb.viewer.api import ROUTES
from msmon_nb.viewer.store import RunStore
from tests.support import tiny
from tests.support.training import model_train_under_ctl

STEPS = 30


def schedule(steps: int = STEPS) -> list[float]:
    return tiny.warmup_lr(steps, peak=0.02, warmup=6)


def adam(net: nn.Cell) -> nn.Optimizer:
    return nn.Adam(net.trainable_params(), learning_rate=schedule())


def weights(net: nn.Cell) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def loop(net, opt, batches, on_step=None) -> list[float]:
    """A functional training loop (value_and_grad + optimizer): losses, one a step."""
    loss_fn = tiny.loss_fn()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    losses = []
    for i, (a, b) in enumerate(batches):
        loss, grads = grad_fn(a, b)
        opt(grads)
        losses.append(float(loss.asnumpy()))
        if on_step is not None:
            on_step(i)
    return losses


def test_checkpoint_from_msmon_ctl_restores_into_fresh_objects_bit_identically(tmp_path):
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=STEPS))
    net = tiny.mlp()
    opt = adam(net)
    reference = loop(net, opt, batches)
    final = weights(net)

    net = tiny.mlp()
    opt = adam(net)
    sent: list = []

    def on_step(i: int) -> None:
        if i == 3:  # the command goes through the control file, as `msmon ctl` writes it
            sent.append(send(mon.run_dir, "checkpoint"))
        time.sleep(0.02)  # the control file is looked at every 0.2 s

    with Monitor(save_dir=str(tmp_path), run_name="ckpt") as mon, mon.watch():
        monitored = loop(net, opt, batches, on_step)
    assert monitored == reference  # monitoring and checkpointing change nothing

    [entry] = load_run(mon.run_dir).interventions
    assert entry["what"] == "checkpoint" and entry["who"] == "ctl" and entry["ok"], entry
    k = entry["step"]
    assert 3 < k < STEPS - 2
    path = Path(entry["path"])
    assert path == mon.run_dir / "checkpoints" / f"step_{k}.ckpt"
    assert entry["bytes"] == path.stat().st_size > 0
    [listed] = load_run(mon.run_dir).checkpoints
    assert (listed["step"], listed["bytes"], listed["rank"]) == (k, entry["bytes"], None)

    # a fresh net (other initial weights) and optimizer take the state and go on
    fresh = tiny.mlp(seed=7)
    fresh_opt = adam(fresh)
    saved = ms.load_checkpoint(str(path))
    assert {"global_step", "learning_rate", "beta1_power"} <= set(saved)
    not_loaded, _ = ms.load_param_into_net(fresh, saved)
    assert not_loaded == []
    not_loaded, _ = ms.load_param_into_net(fresh_opt, saved)
    assert not_loaded == []
    continued = loop(fresh, fresh_opt, batches[k + 1 :])
    assert continued == reference[k + 1 :]  # bit-identical losses
    after = weights(fresh)
    assert after.keys() == final.keys()
    for name, value in final.items():
        assert np.array_equal(after[name], value), name


def test_checkpoint_of_an_explicit_loop_without_optimizer_is_refused_with_the_fix(tmp_path):
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        result = interpret(mon, "checkpoint", source="panel")
    assert not result.ok
    assert "nothing known to save" in result.message
    assert "pass optimizer= to mon.step" in result.message
    assert not (mon.run_dir / "checkpoints").exists()
    [entry] = load_run(mon.run_dir).interventions
    assert (entry["what"], entry["who"], entry["ok"]) == ("checkpoint", "panel", False)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_lr_x_half_from_msmon_ctl_on_model_train_with_a_list_schedule(tmp_path, mode):
    ms.set_context(mode=mode)
    steps = 60
    lr = tiny.warmup_lr(steps, peak=0.05, warmup=10)
    mon, opt, out, code = model_train_under_ctl(tmp_path, steps, lr, ["lr", "x0.5"])
    assert code == 0, out
    assert "lr x0.5: " in out and "from the next step on" in out

    run = load_run(mon.run_dir)
    [entry] = run.interventions
    assert (entry["what"], entry["arg"], entry["who"], entry["ok"]) == ("lr", 0.5, "ctl", True)
    assert entry["label"] == "lr x0.5"
    k = entry["step"]
    assert 5 <= k < steps - 5
    # the answer names the lr in use (the entry step k+1 trains with), not the list's first
    half = np.float32(lr[k]) * np.float32(0.5)
    said = f"lr x0.5: {float(np.float32(lr[k])):.6g} -> {float(half):.6g} (the whole {steps}-entry"
    assert entry["message"].startswith(said), (entry["message"], said)
    series = run.scalars("train/learning_rate")
    got = dict(zip(series.steps.tolist(), series.values.tolist(), strict=True))
    table = np.asarray(lr, np.float32)
    assert sorted(got) == list(range(1, steps + 1))  # Model.train counts steps from 1
    for step, value in got.items():  # step s trains with the schedule's entry s - 1
        want = table[step - 1] * np.float32(0.5) if step > k else table[step - 1]
        assert value == float(want), (step, k)
    assert np.array_equal(opt.learning_rate.learning_rate.asnumpy(), table * np.float32(0.5))

    # the viewer's API serves the same record (all ranks)
    store = RunStore(tmp_path)
    store.scan()
    served = ROUTES["/api/interventions"](store, {"run": [run.name]})
    assert [(i["what"], i["step"], i["who"]) for i in served] == [("lr", k, "ctl")]


def test_lr_forms_constant_grouped_undo_and_a_schedule_cell_refused_unchanged(tmp_path):
    net = tiny.mlp()
    first, second = net.trainable_params()[:2], net.trainable_params()[2:]
    grouped = nn.Momentum(
        [{"params": first, "lr": 0.1}, {"params": second}], learning_rate=0.03, momentum=0.9
    )
    decay = nn.ExponentialDecayLR(0.1, 0.9, 4)
    mixed = nn.Momentum(
        [{"params": first, "lr": decay}, {"params": second}], learning_rate=0.03, momentum=0.9
    )
    cell = nn.SGD(net.trainable_params(), learning_rate=decay)

    def lrs(opt):  # one entry per parameter, shared by its group: each group's once
        held = [getattr(p, "learning_rate", p) for p in opt.learning_rate]  # _ConvertToCell
        unique = {id(p): p for p in held if hasattr(p, "asnumpy")}
        return [float(p.asnumpy()) for p in unique.values()]

    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0, optimizer=grouped)
        assert interpret(mon, "lr", "x0.5", source="%msmonitor").ok
        assert lrs(grouped) == [float(np.float32(0.05)), float(np.float32(0.015))]
        back = interpret(mon, "lr", "\u00d72")  # undo: exact for a power of two
        assert back.ok and back.message.startswith("lr x2: 0.05 -> 0.1")
        assert lrs(grouped) == [float(np.float32(0.1)), float(np.float32(0.03))]

        mon.step(loss=1.0, optimizer=mixed)  # one group's lr is a schedule: nothing changes
        refused = interpret(mon, "lr", "0.5", source="msmon view")
        assert not refused.ok and "LearningRateSchedule" in refused.message
        assert "Nothing was changed" in refused.message
        assert lrs(mixed) == [float(np.float32(0.03))]

        mon.step(loss=1.0, optimizer=cell)
        refused = interpret(mon, "lr", 0.5)
        assert not refused.ok and "ExponentialDecayLR" in refused.message
        assert cell.learning_rate is decay and decay.learning_rate == 0.1
    entries = read_jsonl(mon.run_dir / INTERVENTIONS)
    assert [(e["what"], e["arg"], e["who"], e["ok"]) for e in entries] == [
        ("lr", 0.5, "magic", True),
        ("lr", 2.0, "api", True),
        ("lr", 0.5, "viewer", False),
        ("lr", 0.5, "api", False),
    ]


@pytest.mark.parametrize(
    "text", ["x0.5", "\u00d70.5", "0.5", " x 0.5", "*0.5", "X0.5", "x1/2", "\u00d7 2/4"]
)
def test_lr_factor_forms(text):
    assert check_command("lr", text) == ("lr", 0.5)


@pytest.mark.parametrize(
    "text", ["x0", "-1", "x", "inf", "nan", None, "y0.5", "x1/0", "x1/2/3", "x/2", "x0/1"]
)
def test_bad_lr_factors_say_the_form(text):
    with pytest.raises(ControlError, match=r"lr needs a finite number > 0 \(e\.g\. lr x0\.5\)"):
        check_command("lr", text)


def test_pause_resume_stop_and_freq_are_recorded_by_whom_at_which_step(tmp_path):
    with Monitor(save_dir=str(tmp_path), run_name="iv") as mon:
        for step in range(20):
            mon.step(loss=1.0 / (step + 1))
            if step == 2:
                assert interpret(mon, "pause", source="panel").ok
                assert interpret(mon, "resume", source="msmon ctl").ok
            if step == 4:
                assert interpret(mon, "freq", 2, source="msmon view").ok
                assert interpret(mon, "snapshot").ok is False  # not an intervention
            if step == 6:
                assert interpret(mon, "stop", source="%msmonitor").ok
    run = load_run(mon.run_dir)
    got = [(e["step"], e["who"], e["what"], e["arg"], e["ok"]) for e in run.interventions]
    assert got == [
        (2, "panel", "pause", None, True),
        (2, "ctl", "resume", None, True),
        (4, "viewer", "freq", 2, True),
        (6, "magic", "stop", None, True),
    ]
    assert all(e["message"] and e["time"] > 0 and e["rank"] is None for e in run.interventions)
    assert [e["what"] for e in mon.interventions] == ["pause", "resume", "freq", "stop"]
    line = (mon.run_dir / INTERVENTIONS).read_text().splitlines()[0]
    keys = {"step", "time", "who", "what", "arg", "label", "ok", "message", "rank"}
    assert set(json.loads(line)) == keys
    assert [e["label"] for e in run.interventions] == ["pause", "resume", "freq 2", "stop"]


def test_alert_action_checkpoint_saves_at_the_boundary_and_is_recorded(tmp_path):
    net = tiny.mlp()
    opt = nn.SGD(net.trainable_params(), 0.05)
    alerts = {"nonfinite": {"action": "checkpoint"}}
    with Monitor(save_dir=str(tmp_path), alerts=alerts) as mon:
        for step in range(6):
            mon.step(loss=float("nan") if step == 3 else 1.0, optimizer=opt)
    [entry] = load_run(mon.run_dir).interventions
    assert (entry["who"], entry["what"], entry["arg"], entry["ok"]) == (
        "alert action",
        "checkpoint",
        "nonfinite",
        True,
    )
    assert entry["step"] == 3
    saved = ms.load_checkpoint(entry["path"])
    assert np.array_equal(saved[net[0].weight.name].asnumpy(), net[0].weight.asnumpy())
