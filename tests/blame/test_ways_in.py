"""Which layer started it, through every way in: a real tiny MLP whose gradient explodes
in one known parameter (``tests.support.blamecase``); the first gradient or loss alert
names it first, in its ``blame`` field, its message and alerts.jsonl, and the steps after
it record that parameter's detail."""

from __future__ import annotations

import json
import time

import mindspore as ms
import mindspore.dataset as ds
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from msmon_nb.config.cards import BLAME_KINDS
from msmon_nb.monitor import Monitor
from tests.support import tiny
from tests.support.blamecase import Penalised

AT = 30  # the step the failure begins
STEPS = 45


def run(way: str, tmp_path, layer: int = 1) -> tuple[Monitor, str]:
    net = Penalised(depth=3, layer=layer)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    x, y = tiny.data()
    mon = Monitor(save_dir=str(tmp_path), blame={"detail_steps": 5})
    with mon:
        if way == "model":
            ms.set_context(mode=ms.GRAPH_MODE)
            try:

                class Inject(Callback):
                    def on_train_step_begin(self, run_context):
                        if run_context.original_args().cur_step_num == AT + 1:
                            net.switch_on(150.0)

                    def on_train_step_end(self, run_context):
                        # steps of a real model's length: Model.train holds the scalars
                        # of steps closer than 20 ms and judges them in batches
                        # (monitor.batch), so the window after a 1 ms step's alert would
                        # open several steps late
                        time.sleep(0.025)

                data = ds.NumpySlicesDataset(
                    {"x": x[: STEPS * 8], "y": y[: STEPS * 8]}, shuffle=False
                )
                model = Model(nn.TrainOneStepCell(net, opt))
                model.train(
                    1, data.batch(8), callbacks=[mon.callback(), Inject()], dataset_sink_mode=False
                )
            finally:
                ms.set_context(mode=ms.PYNATIVE_MODE)
            return mon, net.target.name

        def step(a, b):
            loss, grads = grad_fn(a, b)
            opt(grads)
            return loss, grads

        @ms.jit
        def jitted(a, b):
            loss, grads = grad_fn(a, b)
            opt(grads)
            return loss

        if way == "step":
            for i, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
                if i == AT:
                    net.switch_on(150.0)
                loss, grads = step(a, b)
                mon.step(loss=loss, grads=grads, params=opt.parameters)
        else:
            with mon.watch():
                for i, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
                    if i == AT:
                        net.switch_on(150.0)
                    if way == "jit":
                        jitted(a, b)
                    else:
                        step(a, b)
    return mon, net.target.name


@pytest.mark.parametrize("way", ["step", "watch", "jit", "model"])
def test_the_first_alert_names_the_exploding_layer(tmp_path, way):
    mon, target = run(way, tmp_path)
    judged = [a for a in mon.alerts if a.kind in BLAME_KINDS]
    assert judged, [a.message for a in mon.alerts]
    first = judged[0]
    assert first.blame, first.message
    assert first.blame[0]["name"] == target
    start = AT + 1 if way == "model" else AT  # Model.train counts steps from 1
    assert first.blame[0]["step"] == start
    assert f"started in: {target} (z=" in first.message
    # alerts.jsonl carries the same
    lines = [json.loads(line) for line in (mon.run_dir / "alerts.jsonl").read_text().splitlines()]
    written = next(d for d in lines if d["kind"] == first.kind)
    assert written["blame"][0]["name"] == target
    assert "started in:" in written["message"]
    # the detail after the alert, read from the Parameters
    tag = target.lower()
    ratio = mon.series.get(f"param/{tag}/update_ratio")
    assert ratio is not None and len(ratio.values) >= 3
    assert all(v > 0 for v in ratio.values)
    steps = list(ratio.steps)
    # each judged alert opens (or extends) the window for 5 steps after it
    assert min(steps) > first.step and max(steps) <= judged[-1].step + 5
    assert mon.series.get(f"param/{tag}/weight_norm") is not None
    assert mon.series.get(f"param/{tag}/grad_norm") is not None


def test_another_layer_is_named_when_it_explodes(tmp_path):
    mon, target = run("watch", tmp_path, layer=2)
    first = next(a for a in mon.alerts if a.kind in BLAME_KINDS)
    assert target.startswith("body.4") and first.blame[0]["name"] == target


def test_blame_off_leaves_alerts_as_they_were(tmp_path):
    x, y = tiny.data()
    net = Penalised(depth=3, layer=1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    with Monitor(save_dir=str(tmp_path), blame={"enabled": False}) as mon:
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
            if i == AT:
                net.switch_on(150.0)
            loss, grads = grad_fn(a, b)
            opt(grads)
            mon.step(loss=loss, grads=grads, params=opt.parameters)
    assert mon.alerts
    assert all(a.blame is None and "started in" not in a.message for a in mon.alerts)
    assert not [k for k in mon.series if k.startswith("param/")]
