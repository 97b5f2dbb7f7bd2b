"""Model.train: the grad_norm tap reduces the gradients only on collected steps, and the
values it gives there are still exact."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from msmon_nb.monitor import Monitor
from tests.collect.test_callback import STEPS_PER_EPOCH, dataset, reference
from tests.support import tiny


class TapWatcher(ms.train.Callback):
    """After our callback: the tap's stored norm at the end of every step."""

    def __init__(self, callback) -> None:
        self.callback = callback
        self.seen: list[float] = []

    def on_train_step_end(self, run_context):
        self.seen.append(float(self.callback.tap.optimizer.norm.asnumpy()))


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_tap_computes_only_on_collected_steps(tmp_path, mode):
    x, y = tiny.data(n=32 * STEPS_PER_EPOCH)
    _ref_loss, ref_norm = reference(x, y, 0.05, epochs=2)
    ms.set_context(mode=mode)
    try:
        net = tiny.mlp(seed=3)
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
        model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
        with Monitor(save_dir=str(tmp_path), log_interval=3) as mon:
            cb = mon.callback()
            watcher = TapWatcher(cb)
            model.train(2, dataset(x, y), callbacks=[cb, watcher])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    series = mon.series["train/grad_norm"]
    steps = list(series.steps)
    assert steps == list(range(3, 2 * STEPS_PER_EPOCH + 1, 3))
    np.testing.assert_allclose(series.values, [ref_norm[s - 1] for s in steps], rtol=1e-4)
    for step, stored in enumerate(watcher.seen, start=1):
        last_collected = step - step % 3
        # not recomputed between collected steps: it still holds the last collected norm
        expected = ref_norm[last_collected - 1] if last_collected else 0.0
        assert stored == pytest.approx(expected, rel=1e-4), step
