"""``param_stats`` in graph steps: each parameter's gradient norm, where the gradients
never leave the graph (a ``TrainOneStepWithLossScaleCell`` in GRAPH_MODE, under
``mon.watch()`` and ``Model.train``).

The gradients are inside the train cell's graph, so the per-parameter norms come from
the optimizer tap's per-gradient norms (the ones blame keeps), its loss scale and clip
undone; they are measured when ``param_stats`` asks, with blame off too. Checked against
a float64 twin: the unscaled gradient of each parameter, taken before each update.
(Before: weight norms only, silently.)
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.train import Model

from msmon_nb.collect.values import param_tag
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support.reference import assert_same_weights

STEPS, BATCH = 4, 8
SCALE = 1024.0


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def batches():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS * BATCH, 6)).astype(np.float32)
    y = rng.normal(size=(STEPS * BATCH, 2)).astype(np.float32)
    return [(Tensor(x[i : i + BATCH]), Tensor(y[i : i + BATCH])) for i in range(0, len(x), BATCH)]


class ClipCell(nn.TrainOneStepWithLossScaleCell):
    """A fixed loss scale undone, then ``ops.clip_by_global_norm``: what the optimizer
    receives is neither scale nor norm of what the model produced."""

    def construct(self, x, y):
        loss = self.network(x, y)
        sens = ops.ones_like(loss) * self.scale_sense
        grads = self.grad(self.network, self.weights)(x, y, sens)
        grads = self.hyper_map(ops.partial(ops.mul, ops.reciprocal(self.scale_sense)), grads)
        grads = ops.clip_by_global_norm(grads, 0.5)
        return ops.depend(loss, self.optimizer(grads))


def build():
    ms.set_seed(3)
    net = nn.SequentialCell([nn.Dense(6, 8), nn.Tanh(), nn.Dense(8, 2)])
    loss = nn.WithLossCell(net, nn.MSELoss())
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    return net, loss, opt, ClipCell(loss, opt, Tensor(SCALE, ms.float32))


def expected_norms():
    """Each step's per-parameter gradient norms (float64), and the trained weights."""
    net, loss, opt, cell = build()

    def forward(x, y):
        return loss(x, y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    out = []
    for x, y in batches():
        _, grads = grad_fn(x, y)
        out.append({p.name: float(np.linalg.norm(g.asnumpy().astype(np.float64)))
                    for p, g in zip(opt.parameters, grads, strict=True)})  # fmt: skip
        cell(x, y)
    return out, net


@pytest.mark.usefixtures("graph_mode")
@pytest.mark.parametrize("way", ["watch", "model"])
def test_param_stats_grad_norm_in_a_graph_cell(tmp_path, way):
    expected, plain = expected_norms()
    net, _, opt, cell = build()
    config = {
        "track_metrics": ["loss", "grad_norm", "param_stats"],
        "blame": {"enabled": False},  # param_stats asks for the norms on its own
    }
    with Monitor(save_dir=str(tmp_path), log_interval=1, **config) as mon:
        if way == "watch":
            with mon.watch():
                for x, y in batches():
                    cell(x, y)
        else:
            data = ms.dataset.GeneratorDataset(
                [(x.asnumpy(), y.asnumpy()) for x, y in batches()], ["x", "y"], shuffle=False
            )
            Model(cell).train(1, data, callbacks=[mon.callback()], dataset_sink_mode=False)
    run = load_run(mon.run_dir)
    first = 0 if way == "watch" else 1  # Model.train counts from 1
    for p in opt.parameters:
        series = run.scalars(f"param/{param_tag(p.name)}/grad_norm")
        assert series.steps.tolist() == [first + i for i in range(STEPS)], p.name
        np.testing.assert_allclose(series.values, [e[p.name] for e in expected], rtol=1e-5)
        assert f"param/{param_tag(p.name)}/weight_norm" in run.tags
    assert_same_weights(net.trainable_params(), plain.trainable_params())
