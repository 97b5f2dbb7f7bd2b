"""Model.train's fast steps go on to the series, files and rules in batches
(``Monitor.hold_emits``): nothing is lost or reordered, alerts keep their step, a held
step waits at most 50 ms and a step, and an alert that acts is judged at its own step."""

import time

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 10  # per epoch


def model_and_data(nan_at: int | None = None):
    """A tiny graph-mode model and 10 batches; batch ``nan_at`` (from 1) holds a NaN."""
    x, y = tiny.data(n=32 * STEPS)
    if nan_at is not None:
        x[32 * (nan_at - 1)] = np.nan
    net = tiny.mlp(seed=3)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=nn.SGD(net.trainable_params(), 0.05))
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    return model, data


class SeenAfterOurs(Callback):
    """Runs after the monitor's callback at each step end: the last step in the series,
    and an optional pause (as slow user code between steps would make)."""

    def __init__(self, mon, sleep_at=None):
        self.mon, self.sleep_at, self.seen = mon, sleep_at, {}

    def on_train_step_end(self, run_context):
        step = int(run_context.original_args().cur_step_num)
        loss = self.mon.series.get("train/loss")
        self.seen[step] = int(loss.steps[-1]) if loss is not None and len(loss) else None
        if step == self.sleep_at:
            time.sleep(0.08)


def train(mon, model, data, epochs, extra=()):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        model.train(epochs, data, callbacks=[mon.callback(), *extra], dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_fast_steps_are_held_and_nothing_is_lost(tmp_path):
    model, data = model_and_data()
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
        seen = SeenAfterOurs(mon, sleep_at=15)
        train(mon, model, data, 3, [seen])
        # once Model.train returns, every step is in the live series, in order
        assert mon.series["train/loss"].steps.tolist() == list(range(1, 3 * STEPS + 1))
    lagging = [s for s, last in seen.seen.items() if last != s]
    assert lagging, f"no step was held on a ~1 ms step: {seen.seen}"
    # after 80 ms of user code at step 15, step 16 finds the oldest held step overdue
    # and passes everything on with itself
    assert seen.seen[16] == 16, seen.seen
    run = load_run(mon.run_dir)
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate"):
        assert run.scalars(tag).steps.tolist() == list(range(1, 3 * STEPS + 1)), tag
    np.testing.assert_allclose(
        run.scalars("train/loss").values, mon.series["train/loss"].values, rtol=1e-6
    )


def test_held_alerts_keep_the_step_they_began(tmp_path):
    model, data = model_and_data(nan_at=7)
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
        train(mon, model, data, 1)
        nonfinite = [a for a in mon.alerts if a.kind == "nonfinite"]
        assert nonfinite, [a.kind for a in mon.alerts]
        assert nonfinite[0].step == 7
        assert mon.last_step == STEPS  # warn: training went on
    on_disk = [a for a in load_run(mon.run_dir).alerts if a["kind"] == "nonfinite"]
    assert on_disk and on_disk[0]["step"] == 7


def test_an_alert_that_acts_is_judged_at_its_own_step(tmp_path):
    model, data = model_and_data(nan_at=7)
    cfg = {"alerts": {"nonfinite": {"action": "stop"}}}
    with Monitor(cfg, save_dir=str(tmp_path), log_interval=1) as mon:
        seen = SeenAfterOurs(mon)
        train(mon, model, data, 1, [seen])
    assert all(last == step for step, last in seen.seen.items()), seen.seen  # none held
    assert [a.step for a in mon.alerts if a.kind == "nonfinite"][:1] == [7]
    assert mon.last_step == 7
    assert load_run(mon.run_dir).status == "stopped"
