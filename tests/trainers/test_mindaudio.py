"""MindAudio 0.3.0's ``TrainOneStepWithLossScaleCellv2`` (``mindaudio/loss/loss_scale.py``,
loaded from the installed file: the ``mindaudio`` package's ``__init__`` imports its
data downloaders, which need packages the tests do not install), driven by hand in
GRAPH_MODE under ``mon.watch()``, against an unmonitored twin.

The cell unscales the gradients by its ``scale_sense`` (1024 here), then clips each one
**by value** to [-1, 1] with its ``ClipGradients`` cell before the optimizer. Its NPU
float-status overflow check has no CPU kernel: exactly those two methods check with
``amp.all_finite`` instead, in the monitored run and the twin alike (``on_cpu``); the
rest is MindAudio's. ``train/grad_norm`` is the unscaled norm before the clip,
``train/grad_norm_clipped`` the norm of what the optimizer received (before, it was not
recorded: the page showed 1,377 while the optimizer applied a gradient of norm 25.5).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.overflow import on_cpu

pytestmark = pytest.mark.usefixtures("graph_mode")

STEPS, BATCH, SCALE = 5, 8, 1024.0


def shipped_cell() -> type:
    spec = importlib.util.find_spec("mindaudio")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mindaudio 0.3.0 is not installed (make venv installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "loss" / "loss_scale.py"
    name = "mindaudio_shipped_loss_scale"
    if name not in sys.modules:  # (MindSpore's graph parser looks the module up by name)
        loaded = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(sys.modules[name])
    return sys.modules[name].TrainOneStepWithLossScaleCellv2


class WithOutput(nn.Cell):
    """A loss cell as MindAudio's cell wants it: it reads ``network.output``."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.net, self.loss = net, nn.MSELoss()
        self.output = Tensor(0.0, ms.float32)

    def construct(self, x, y):
        return self.loss(self.net(x), y)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, BATCH, 16)).astype(np.float32) * 3
    y = rng.normal(size=(STEPS, BATCH, 4)).astype(np.float32) * 30
    return [(Tensor(a), Tensor(b)) for a, b in zip(x, y, strict=True)]


def build():
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    loss_cell = WithOutput(net)
    cell = on_cpu(shipped_cell())(loss_cell, opt, scale_sense=Tensor(SCALE, ms.float32))
    return net, loss_cell, opt, cell


def test_clip_by_value_gives_the_clipped_norm_and_the_norm_before(tmp_path):
    _, loss_cell, opt, cell = build()

    def forward(x, y):
        return loss_cell(x, y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    expected, clipped = [], []
    for x, y in data():
        ms.set_context(mode=ms.PYNATIVE_MODE)
        try:
            _, grads = grad_fn(x, y)
        finally:
            ms.set_context(mode=ms.GRAPH_MODE)
        arrays = [g.asnumpy().astype(np.float64) for g in grads]
        expected.append(math.sqrt(sum(float((a * a).sum()) for a in arrays)))
        clipped.append(math.sqrt(sum(float((np.clip(a, -1, 1) ** 2).sum()) for a in arrays)))
        cell(x, y)
    plain = [p.asnumpy().copy() for p in opt.get_parameters()]
    _, _, opt2, cell2 = build()
    with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
        for x, y in data():
            cell2(x, y)
    assert all(
        np.array_equal(a, b.asnumpy()) for a, b in zip(plain, opt2.get_parameters(), strict=True)
    ), "monitoring changed training"
    run = load_run(mon.run_dir)
    assert all(c < e for c, e in zip(clipped, expected, strict=True))  # the clip acts
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, expected, rtol=1e-3)
    np.testing.assert_allclose(run.scalars("train/grad_norm_clipped").values, clipped, rtol=1e-3)
    np.testing.assert_allclose(run.scalars("train/loss_scale").values, SCALE)
    assert not mon.alerts, [a.message for a in mon.alerts]
