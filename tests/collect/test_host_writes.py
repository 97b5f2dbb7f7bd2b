"""In-place writes of the taps' switches (``collect.graph.write_scalar``).

The taps switch the in-graph norm on and off around collected steps. On CPU the switch
is written through the Parameter's ``asnumpy()`` view once ``probe_host_writes`` proved
that compiled graphs read that buffer; these tests check the claim on the installed
MindSpore for both kinds of graphs the taps live in, compiled *before* the writes.
``test_callback.py::test_callbacks_taking_turns_...`` checks the values a run collecting
every 2nd step records through ``Model.train`` (the switch toggled at every step).
"""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import Parameter, Tensor, nn, ops  # noqa: E402

from msmon_nb.collect.graph import probe_host_writes, tap_scalar, write_scalar  # noqa: E402


def test_the_probe_finds_in_place_writes_on_cpu():
    assert ms.get_context("device_target") == "CPU"
    assert probe_host_writes() is True


@pytest.mark.parametrize("kind", ["jit", "cell"])
def test_writes_reach_graphs_compiled_before(kind):
    assert probe_host_writes()
    flag = tap_scalar("msmon_test_flag", 0, ms.int32)
    total = tap_scalar("msmon_test_total", 0.0, ms.float32)

    if kind == "jit":

        @ms.jit
        def run(x):
            if flag > 0:
                ops.assign_add(total, x.sum())
            return x * ops.cast(flag, ms.float32)

    else:

        class Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.flag, self.total = flag, total

            def construct(self, x):
                if self.flag > 0:
                    ops.assign_add(self.total, x.sum())
                return x * ops.cast(self.flag, ms.float32)

        run = Net()
    x = Tensor(np.ones(3, np.float32))
    run(x)  # compiled while the flag is 0
    seen = []
    for value in (1, 0, 1, 1, 0):
        write_scalar(flag, value)
        seen.append(float(run(x).asnumpy()[0]))
    assert seen == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert total.item() == pytest.approx(9.0)  # three "on" calls of sum 3
    write_scalar(total, 0.0)  # zeroed in place: the graph adds to the same buffer
    write_scalar(flag, 1)
    run(x)
    assert total.item() == pytest.approx(3.0)


def test_a_parameter_swapped_by_set_data_is_not_what_jit_reads():
    """Why the switch is never written with ``set_data``: a jit graph compiled before
    keeps the old buffer (the reason the in-place write exists at all)."""
    flag = Parameter(Tensor(0, ms.int32), name="msmon_test_swapped", requires_grad=False)

    @ms.jit
    def read(x):
        return x + flag

    zero = Tensor(0, ms.int32)
    read(zero)
    flag.set_data(Tensor(1, ms.int32))
    assert int(read(zero).asnumpy()) == 0


def test_per_gradient_norms_read_through_the_view_are_each_steps_own(tmp_path):
    """``OptimizerTap.read_each`` reads the graph's per-gradient norms through the kept
    host view (no ``asnumpy()`` per step): on every collected step of a real
    ``Model.train`` they are that step's norms, not the previous step's (their
    root-sum-square is the step's own grad_norm, read by ``item()``) and not zeros."""
    import mindspore.dataset as mds
    from mindspore.train import Callback, Model

    from msmon_nb.monitor import Monitor
    from tests.support import tiny

    x, y = tiny.data(n=30 * 16)
    net = tiny.mlp()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16)
    mon = Monitor(save_dir=str(tmp_path), log_interval=1, blame={"detail_steps": 0})
    seen: list[tuple[float, np.ndarray]] = []

    class Check(Callback):  # after ours: what its step's reads gave
        def on_train_step_end(self, run_context):
            _, names, norms = mon.collector.param_norms
            assert len(names) == len(norms) == len(opt.parameters)
            seen.append((ours.tap.optimizer.read()[1], norms.copy()))

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ours = mon.callback()
        model.train(1, data, callbacks=[ours, Check()], dataset_sink_mode=False)
        seen.clear()  # the first epoch compiled; the second is read through the view
        model.train(1, data, callbacks=[ours, Check()], dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        mon.close()
    assert probe_host_writes()  # so read_each took the view
    assert len(seen) == 30
    for norm, each in seen:
        assert np.sqrt((each**2).sum()) == pytest.approx(norm, rel=1e-5)
    assert len({each.tobytes() for _, each in seen}) == 30  # a new row every step
