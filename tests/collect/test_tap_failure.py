"""A tap of ours that fails inside the user's graph never ends training: that path is
switched off with one warning, the step compiles and runs without it, once.

The failure is injected (a tap that cannot compile is not something a supported
MindSpore does today): ``square_sum``, which every optimizer tap compiles into the
user's graph, is replaced by one with a statement MindSpore's graph parser refuses.
Sparse gradients, which did break the tap for real, are checked against a plain run.
"""

from __future__ import annotations

import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msmon_nb.collect import graph
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.conformance.harness import Case, run_case


def _uncompilable(g):
    try:  # graph syntax has no try: compiling any graph that calls this fails
        return ms.ops.reduce_sum(g * g)
    finally:
        pass


@pytest.mark.parametrize("loop", ["model", "cell", "jit"])
def test_a_tap_that_cannot_compile_is_switched_off_and_training_goes_on(
    loop, tmp_path, monkeypatch
):
    case = Case("nn.Adam", loop, "list")
    monkeypatch.setattr(graph, "square_sum", _uncompilable)
    plain, monitored = run_case(case, tmp_path)
    told = [w for w in monitored.warnings if "could not compile" in w]
    assert len(told) == 1, told
    assert "Unsupported statement 'Try'" in told[0]
    # training untouched: same losses, bit-identical model and optimizer state
    assert monitored.losses == plain.losses
    assert all(np.array_equal(plain.state[k], monitored.state[k]) for k in plain.state)
    run = monitored.run
    assert run.scalars("train/loss").values.tolist() == pytest.approx(plain.losses, rel=0)
    assert not monitored.alerts


def test_sparse_gradients_pass_untouched_with_one_warning(tmp_path):
    """``nn.EmbeddingLookup(sparse=True)`` hands LazyAdam a RowTensor; before, the tap's
    ``depend`` over the gradients made LazyAdam's graph fail to compile."""

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.EmbeddingLookup(20, 4, sparse=True, target="CPU")
            self.fc = nn.Dense(4, 2)

        def construct(self, x):
            return self.fc(self.emb(x).mean(1))

    def train(monitor=None):
        ms.set_seed(0)
        net = Net()
        opt = nn.LazyAdam(net.trainable_params(), [0.01, 0.02, 0.03, 0.04])
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)
        rng = np.random.default_rng(0)
        losses = []
        watch = monitor.watch() if monitor is not None else _Nothing()
        with watch:
            for _ in range(4):
                x = Tensor(rng.integers(0, 20, (8, 3)).astype(np.int32))
                losses.append(float(cell(x, Tensor(np.zeros(8, np.int32))).asnumpy()))
        return losses, [p.asnumpy().copy() for p in opt.get_parameters()]

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        plain_losses, plain_state = train()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Monitor(save_dir=str(tmp_path), log_interval=1) as mon:
                losses, state = train(mon)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain_state, state, strict=True))
    sparse = [str(w.message) for w in caught if "sparse gradients" in str(w.message)]
    assert len(sparse) == 1, [str(w.message) for w in caught]
    run = load_run(mon.run_dir)
    assert "train/grad_norm" not in run.tags()
    lr = run.scalars("train/learning_rate").values.tolist()
    assert lr == pytest.approx([0.01, 0.02, 0.03, 0.04], rel=1e-7)  # the lr tap still sees it


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
