"""Starting and ending a watch recompiles only the graphs that hold something it taps,
and leaves nothing of ours in any graph (``collect.recompile``).

Compiles are observed for real: each jit function reads a property of a ``Probe`` that
MindSpore evaluates while it parses the function (the property's body runs at compile
time only, never when the compiled graph runs), so ``probe.compiles`` moves exactly when
MindSpore compiles the function. Every monitored model has a never-monitored twin
trained on the same batches: after the monitor closed, both train on, bit-identical
(weights and optimizer state), and the taps' counters no longer move.
"""

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.train import Model

from msmon_nb.collect.hooks import compile_cache
from msmon_nb.collect.recompile import SUFFIX
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny

LR = 0.05


class Probe:
    """Counts how often MindSpore reads ``one`` while compiling a function."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def one(self) -> float:
        self.reads += 1
        return 1.0


def make_other():
    """A jit function of the user's that holds no optimizer, and its probe."""
    probe = Probe()

    @ms.jit
    def other(a):
        return ops.relu(a) * probe.one

    return other, probe


def make_step(seed=3):
    """A jit train step (Momentum), its net, optimizer and probe."""
    net = tiny.mlp(seed=seed)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=LR, momentum=0.9)
    probe = Probe()

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss * probe.one

    return net, opt, train_step, probe


def state(net, opt) -> list[np.ndarray]:
    """Weights and optimizer state (moments, step count, lr), as host copies."""
    params = list(net.get_parameters()) + list(opt.get_parameters())
    return [p.asnumpy().copy() for p in params]


def assert_identical(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def compiles(probe: Probe, reads_per_compile: int) -> int:
    assert probe.reads % reads_per_compile == 0, probe.reads
    return probe.reads // reads_per_compile


def ours_left() -> list[str]:
    return [p for p in compile_cache() if p.endswith(SUFFIX)]


def test_unrelated_jit_function_is_not_recompiled_by_a_watch(tmp_path):
    """The issue's case: a notebook's jit function compiled in an earlier cell, then a
    monitored cell training with a jit step. The function holds no optimizer: its
    first call under the watch and after it find its graph (no compile); the train step
    compiled before the watch compiles once under it, with the taps (exact grad_norm),
    and after the watch runs its graph from before again (no compile)."""
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=9))
    other, other_probe = make_other()
    a = batches[0][0]
    other(a)
    per_other = other_probe.reads
    assert per_other > 0
    net, opt, train_step, step_probe = make_step()
    train_step(*batches[0])
    per_step = step_probe.reads
    twin_net, twin_opt, twin_step, _ = make_step()
    twin_losses = [float(twin_step(*b).asnumpy()) for b in batches]
    norms = reference_norms(batches[1:6], batches[0])
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch() as watch:
        losses = [float(train_step(*b).asnumpy()) for b in batches[1:6]]
        assert compiles(step_probe, per_step) == 2  # once with the taps
        other(a)  # its first call under the watch
        assert compiles(other_probe, per_other) == 1
        tap = watch.tap
        assert ours_left()  # the step's tapped graph, under a phase of its own
    assert ours_left() == []  # dropped with the taps
    counts = tap.counts()
    losses += [float(train_step(*b).asnumpy()) for b in batches[6:]]
    other(a)
    assert compiles(other_probe, per_other) == 1  # not before, under, or after the watch
    assert compiles(step_probe, per_step) == 2  # after: its graph from before, as it was
    assert tap.counts() == counts  # nothing of ours runs in it any more
    assert losses == twin_losses[1:]
    assert_identical(state(net, opt), state(twin_net, twin_opt))
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-4)
    # the positive control: a compile moves the probe
    compile_cache().discard(next(p for p in compile_cache() if ".other." in p))
    other(a)
    assert compiles(other_probe, per_other) == 2


def reference_norms(batches, first=None) -> list[float]:
    """grad_norm of each step of a twin trained in PyNative (float64 numpy) on
    ``batches``, after one step on ``first`` (the monitored net's step before the watch)."""
    net = tiny.mlp(seed=3)
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=LR, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    if first is not None:
        opt(grad_fn(*first)[1])
    norms = []
    for a, b in batches:
        _, grads = grad_fn(a, b)
        norms.append(tiny.numpy_global_norm(grads))
        opt(grads)
    return norms


def test_a_step_first_compiled_under_the_watch_keeps_nothing_of_ours(tmp_path):
    """A jit step defined inside the monitored cell compiles with the taps; after the
    watch it compiles once more, without them, and trains as its twin does."""
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=8))
    net, opt, train_step, probe = make_step()
    twin_net, twin_opt, twin_step, _ = make_step()
    twin_losses = [float(twin_step(*b).asnumpy()) for b in batches]
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch() as watch:
        losses = [float(train_step(*b).asnumpy()) for b in batches[:4]]
        per_compile = probe.reads
        tap = watch.tap
    counts = tap.counts()
    losses += [float(train_step(*b).asnumpy()) for b in batches[4:]]
    assert compiles(probe, per_compile) == 2  # under the watch, then once without it
    assert tap.counts() == counts
    assert ours_left() == []
    assert losses == twin_losses
    assert_identical(state(net, opt), state(twin_net, twin_opt))
    assert load_run(mon.run_dir).scalars("train/grad_norm").steps.tolist() == [0, 1, 2, 3]


def train_cell(seed=3, probe=None):
    net = tiny.mlp(seed=seed)
    opt = nn.Momentum(net.trainable_params(), learning_rate=LR, momentum=0.9)
    loss = nn.WithLossCell(net, tiny.loss_fn())
    if probe is not None:
        loss = ProbedLoss(loss, probe)
    return net, opt, nn.TrainOneStepCell(loss, opt)


class ProbedLoss(nn.Cell):
    """The loss times ``probe.one`` (1.0): MindSpore reads it when it compiles the train
    cell's graph, so ``probe.reads`` counts that cell's compiles."""

    def __init__(self, loss: nn.Cell, probe: Probe) -> None:
        super().__init__()
        self.loss = loss
        self.probe = probe

    def construct(self, x, y):
        return self.loss(x, y) * self.probe.one


def test_graph_mode_train_cell_by_hand(tmp_path):
    """A train cell driven by hand in GRAPH_MODE compiles with the taps under the watch
    (under a phase of its own: the graph it had stays cached), records exact grad_norm,
    and after the watch runs that graph again, compiling nothing, bit-identically to its
    twin with no tap of ours in it; a jit function compiled before is not recompiled."""
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=9))
    norms = reference_norms(batches[1:6], batches[0])
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        other, other_probe = make_other()
        a = batches[0][0]
        other(a)
        per_other = other_probe.reads
        probe = Probe()
        net, opt, step = train_cell(probe=probe)
        twin_net, twin_opt, twin = train_cell(probe=Probe())
        twin_losses = [float(twin(*b).asnumpy()) for b in batches]
        losses = [float(step(*batches[0]).asnumpy())]
        per_cell = probe.reads
        with Monitor(save_dir=str(tmp_path)) as mon, mon.watch() as watch:
            losses += [float(step(*b).asnumpy()) for b in batches[1:6]]
            tap = watch.tap
            assert tap.counts().optimizer == 5  # the cell's graph holds the tap
        assert compiles(probe, per_cell) == 2  # before the watch, and once under it
        counts = tap.counts()
        losses += [float(step(*b).asnumpy()) for b in batches[6:]]
        other(a)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert compiles(probe, per_cell) == 2  # after it: the graph from before, cached
    assert not [p for p in step.compile_cache if SUFFIX in p]
    assert compiles(other_probe, per_other) == 1
    assert tap.counts() == counts
    assert losses == twin_losses
    assert_identical(state(net, opt), state(twin_net, twin_opt))
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-4)


def dataset(batches):
    xs = np.concatenate([b[0].asnumpy() for b in batches])
    ys = np.concatenate([b[1].asnumpy() for b in batches])
    return mds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(len(batches[0][1]))


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_model_train_with_callback(tmp_path, mode):
    """Model.train with mon.callback(): exact grad_norm while monitored; once the monitor
    closed, Model.train trains on bit-identically to an unmonitored twin Model and no
    tap counter moves (the train cell's graph and the optimizer's jit construct lost
    our wrappers); a jit function compiled before is not recompiled."""
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=10))
    ms.set_context(mode=mode)
    try:
        other, other_probe = make_other()
        a = batches[0][0]
        other(a)
        per_other = other_probe.reads
        net, opt, _ = train_cell()
        twin_net, twin_opt, _ = train_cell()
        model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
        twin = Model(twin_net, loss_fn=tiny.loss_fn(), optimizer=twin_opt)
        twin.train(1, dataset(batches[:5]), dataset_sink_mode=False)
        with Monitor(save_dir=str(tmp_path)) as mon:
            callback = mon.callback()
            model.train(1, dataset(batches[:5]), callbacks=[callback], dataset_sink_mode=False)
            tap = callback.tap
            assert tap.counts().optimizer > 0  # the graphs hold the tap
        assert_identical(state(net, opt), state(twin_net, twin_opt))
        counts = tap.counts()
        model.train(1, dataset(batches[5:]), dataset_sink_mode=False)
        twin.train(1, dataset(batches[5:]), dataset_sink_mode=False)
        other(a)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert compiles(other_probe, per_other) == 1
    assert tap.counts() == counts
    assert ours_left() == []
    assert_identical(state(net, opt), state(twin_net, twin_opt))
    norms = reference_norms(batches[:5])
    run = load_run(mon.run_dir)
    np.testing.assert_allclose(run.scalars("train/grad_norm").values, norms, rtol=1e-4)
