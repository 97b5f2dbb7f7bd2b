"""``activations`` / ``act_grad`` on PyNative loops: each selected module's output (and
its gradient) summarised as ``act/<module>/<stat>`` on collected steps.

Reference: an unmonitored twin trained on the same batches, with forward and backward
hooks of its own that only copy the outputs and output gradients to float64 numpy at the
collected steps. Summary files hold float32 scalars: norms and means are compared at that
precision (rtol 1e-6), max |x|, non-finite counts and zero shares exactly. Training is
bit-identical with the hooks (weights and Adam's moments). Steps that are not collected
run no hook of ours at all (counted).
"""

import re
import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from msmon_nb.collect.activations import DEFAULT_MODULES, select_modules
from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny
from tests.support.extent64 import stats64

STEPS, EVERY = 7, 3
STATS = ("norm", "max_abs", "mean", "nonfinite", "zero_frac")


class Net(nn.Cell):
    """Named layers (paths fc1, act, fc2) inside a loss wrapper, as users write them."""

    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.fc1 = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(16, 3)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def build():
    net = Net()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_fn = tiny.loss_fn()

    def forward(a, c):  # a def, not a lambda: a jit step's graph parses it
        return loss_fn(net(a), c)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    return net, opt, grad_fn


def state(opt):
    return [t.asnumpy().copy() for t in (*opt.parameters, *opt.moment1, *opt.moment2)]


def twin(grads):
    """Expected values by step and the final state, from a never-monitored twin whose
    own hooks only read (only numpy leaves: see test_param_extent.twin)."""
    net, opt, grad_fn = build()
    seen = {}
    hooks = []
    for name in ("fc1", "act", "fc2"):
        cell = getattr(net, name)

        def forward(c, i, o, name=name):
            seen.setdefault(f"act/{name}", o.asnumpy().copy())

        def backward(c, gi, go, name=name):
            seen.setdefault(f"act_grad/{name}", go[0].asnumpy().copy())

        hooks.append(cell.register_forward_hook(forward))
        if grads:
            hooks.append(cell.register_backward_hook(backward))
    expected = {}
    x, y = tiny.data()
    for step, (a, c) in enumerate(tiny.batches(x, y, steps=STEPS)):
        seen.clear()
        _, g = grad_fn(a, c)
        opt(g)
        if step % EVERY == 0:
            expected[step] = {
                f"{prefix}/{stat}": value
                for prefix, array in seen.items()
                for stat, value in stats64(array).items()
            }
    return expected, state(opt)


def hook_state(cell):
    """A cell's hook attributes (their types and sizes) and the names of its primitives."""
    hooks = {k: (type(v).__name__, len(v) if hasattr(v, "__len__") else v)
             for k, v in vars(cell).items() if "hook" in k}  # fmt: skip
    return hooks, sorted(vars(cell).get("_primitives", {}))


def plain_hook_state():
    """``hook_state`` of every cell after the same training, never monitored or hooked."""
    net, opt, grad_fn = build()
    x, y = tiny.data()
    for a, c in tiny.batches(x, y, steps=STEPS):
        _, g = grad_fn(a, c)
        opt(g)
    return {name: hook_state(cell) for name, cell in net.cells_and_names()}


def recorded(run):
    return {t: run.scalars(t) for t in run.tags() if re.match(r"act(_grad)?/", t)}


@pytest.mark.parametrize("grads", [False, True], ids=["act", "act+grad"])
def test_pynative_exact_against_float64_hooks_and_training_unchanged(tmp_path, grads):
    expected, final = twin(grads)
    track = [*CORE_METRICS, "activations", *(["act_grad"] if grads else [])]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track,
               module_targets=["^fc", "^act$"])  # fmt: skip
    net, opt, grad_fn = build()
    with Monitor(**cfg) as mon, mon.watch() as watch:
        x, y = tiny.data()
        for a, c in tiny.batches(x, y, steps=STEPS):
            _, g = grad_fn(a, c)
            opt(g)
    for want, got in zip(final, state(opt), strict=True):
        np.testing.assert_array_equal(got, want)
    series = recorded(load_run(mon.run_dir))
    modules = 3 * (2 if grads else 1)
    assert set(series) == set(expected[0]) and len(series) == modules * len(STATS)
    steps = sorted(expected)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        if tag.endswith(("norm", "mean")):
            np.testing.assert_allclose(s.values, want, rtol=1e-6, atol=1e-30, err_msg=tag)
        else:
            np.testing.assert_array_equal(s.values, np.float32(want), err_msg=tag)
    assert series["act/act/zero_frac"].values.min() > 0  # a ReLU's zeros show
    # hooks ran on the 3 collected steps only: one call per module and direction
    assert watch.acts.calls == len(steps) * modules
    assert watch.acts.computed == len(steps) * modules * len(STATS)
    assert not watch.acts.handles  # none left on the user's cells
    # and nothing registering them made: each cell's hook attributes are what training
    # without a monitor leaves
    assert {name: hook_state(cell) for name, cell in net.cells_and_names()} == plain_hook_state()


def test_default_selection_spreads_over_a_deep_model():
    layers = [nn.Dense(4, 4) for _ in range(40)]
    body = nn.SequentialCell([c for layer in layers for c in (layer, nn.ReLU())])
    chosen = select_modules(nn.WithLossCell(body, nn.MSELoss()), None)
    assert len(chosen) == DEFAULT_MODULES
    paths = [p for p, _ in chosen]
    assert paths[0] == "0" and paths[-1] == "78"  # the first and the last Dense, by param names
    assert all(isinstance(c, nn.Dense) for _, c in chosen)
    picked = select_modules(nn.WithLossCell(body, nn.MSELoss()), [r"^(1|3)$"])
    assert [p for p, _ in picked] == ["1", "3"]  # two ReLUs, by their place in the tree


def test_a_dense_with_its_activation_is_taken_by_default_after_its_relu(tmp_path):
    """``nn.Dense(..., activation="relu")`` keeps its ReLU as a sub-cell without
    parameters: the default selection takes the Dense (its output is after the ReLU,
    where a dying layer's zeros show), not only cells without sub-cells."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    net = nn.SequentialCell([nn.Dense(8, 16, activation="relu"), nn.Dense(16, 3)])
    assert [p for p, _ in select_modules(net, None)] == ["0", "1"]
    opt = nn.SGD(net.trainable_params(), 0.05)
    grad_fn = ms.value_and_grad(nn.WithLossCell(net, tiny.loss_fn()), None, opt.parameters)
    x, y = tiny.data()
    metrics = [*CORE_METRICS, "activations"]
    with Monitor(save_dir=str(tmp_path), track_metrics=metrics) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=4):
            _, grads = grad_fn(a, b)
            opt(grads)
    run = load_run(mon.run_dir)
    assert run.scalars("act/0/zero_frac").values.min() > 0  # after its ReLU: zeros
    assert run.scalars("act/1/zero_frac").values.max() == 0  # logits: none


def forward_reference(net, a):
    """{act/<name>: float64 output} of the twin's modules on batch ``a``: a PyNative
    forward pass with hooks that only copy (the twin's weights before its step, as the
    compiled step's forward sees them)."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    seen = {}
    handles = []
    for name in ("fc1", "act", "fc2"):

        def forward(c, i, o, name=name):
            seen[f"act/{name}"] = o.asnumpy().astype(np.float64)

        handles.append(getattr(net, name).register_forward_hook(forward))
    try:
        net(a)
    finally:
        for handle in handles:
            handle.remove()
        ms.set_context(mode=mode)
    return seen


def compiled_loop(shape):
    """(network, optimizer, step function) of a compiled loop: a ``@ms.jit`` step, or a
    ``TrainOneStepCell`` called in GRAPH_MODE."""
    net, opt, grad_fn = build()
    if shape == "jit":

        @ms.jit
        def step(a, c):
            loss, g = grad_fn(a, c)
            opt(g)
            return loss

        return net, opt, step
    return net, opt, nn.TrainOneStepCell(nn.WithLossCell(net, tiny.loss_fn()), opt)


@pytest.fixture(params=["jit", "graph_cell"])
def compiled(request):
    if request.param == "graph_cell":
        ms.set_context(mode=ms.GRAPH_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def compiled_twin(shape):
    net, opt, step = compiled_loop(shape)
    expected = {}
    x, y = tiny.data()
    for i, (a, c) in enumerate(tiny.batches(x, y, steps=STEPS)):
        if i % EVERY == 0:
            expected[i] = {
                f"{prefix}/{stat}": value
                for prefix, array in forward_reference(net, a).items()
                for stat, value in stats64(array).items()
            }
        step(a, c)
    return expected, state(opt)


def test_compiled_steps_compute_them_in_the_graph(tmp_path, compiled):
    expected, final = compiled_twin(compiled)
    track = [*CORE_METRICS, "activations"]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track,
               module_targets=["^fc", "^act$"])  # fmt: skip
    net, opt, step = compiled_loop(compiled)
    classes = {name: type(cell) for name, cell in net.cells_and_names()}
    with Monitor(**cfg) as mon, mon.watch() as watch:
        x, y = tiny.data()
        for a, c in tiny.batches(x, y, steps=STEPS):
            step(a, c)
    for want, got in zip(final, state(opt), strict=True):
        np.testing.assert_array_equal(got, want)
    assert {name: type(cell) for name, cell in net.cells_and_names()} == classes  # put back
    series = recorded(load_run(mon.run_dir))
    assert set(series) == set(expected[0]) and len(series) == 3 * len(STATS)
    steps = sorted(expected)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        if tag.endswith(("nonfinite", "zero_frac")):
            np.testing.assert_array_equal(s.values, np.float32(want), err_msg=tag)
        else:  # graph and PyNative kernels may round an activation apart in its last bit
            np.testing.assert_allclose(s.values, want, rtol=2e-6, atol=1e-30, err_msg=tag)
    assert watch.acts.graph.reads == len(steps)  # read on collected steps only
    assert watch.acts.graph.computed() == len(steps) * 3  # and computed on those only
    # after the watch the same step runs the user's classes again, and trains on
    x, y = tiny.data()
    for a, c in tiny.batches(x, y, steps=2):
        assert np.isfinite(float(step(a, c).asnumpy()))


class Before(Callback):
    """The twin's record of each collected step's inputs and weights, taken before the
    step (as the step's own forward pass sees them)."""

    def __init__(self, net, offset=0):
        self.net, self.kept, self.offset = net, {}, offset  # offset: earlier calls' steps

    def on_train_step_begin(self, run_context):
        step = self.offset + run_context.original_args().cur_step_num
        if step % EVERY == 0:
            weights = {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}
            batch = run_context.original_args().train_dataset_element[0].asnumpy()
            self.kept[step] = (batch, weights)


def model_run(callbacks):
    net, opt, _ = build()
    model = Model(net, tiny.loss_fn(), opt)
    x, y = tiny.data(n=32 * STEPS)
    data = mds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(32)
    model.train(1, data, callbacks=callbacks(net), dataset_sink_mode=False)
    return net, opt


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_model_train_callback_records_them(tmp_path, mode):
    if mode == "graph":
        ms.set_context(mode=ms.GRAPH_MODE)
    try:
        before = []
        _, twin_opt = model_run(lambda net: before.append(Before(net)) or before)
        final = state(twin_opt)
        del twin_opt
        fresh, _, _ = build()
        expected = {}
        for step, (x, weights) in before[0].kept.items():
            for p in fresh.trainable_params():
                p.set_data(ms.Tensor(weights[p.name]))
            expected[step] = {
                f"{prefix}/{stat}": value
                for prefix, array in forward_reference(fresh, ms.Tensor(x)).items()
                for stat, value in stats64(array).items()
            }
        track = [*CORE_METRICS, "activations"]
        cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track,
                   module_targets=["^fc", "^act$"])  # fmt: skip
        with Monitor(**cfg) as mon:
            net, opt = model_run(lambda net: [mon.callback()])
            classes = {name: type(cell) for name, cell in net.cells_and_names()}
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    for want, got in zip(final, state(opt), strict=True):
        np.testing.assert_array_equal(got, want)
    assert all(not hasattr(c, "_msmon_act_of") for c in classes.values())  # put back
    series = recorded(load_run(mon.run_dir))
    steps = sorted(expected)
    assert steps == [3, 6] and set(series) == set(expected[3])
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        if tag.endswith(("nonfinite", "zero_frac")):
            np.testing.assert_array_equal(s.values, np.float32(want), err_msg=tag)
        else:
            np.testing.assert_allclose(s.values, want, rtol=2e-6, atol=1e-30, err_msg=tag)


@pytest.mark.parametrize("before", [False, True], ids=["compiled_inside", "compiled_before"])
def test_jit_grad_function_with_the_optimizer_in_python(tmp_path, before):
    """``ms.jit(value_and_grad(...))`` and the optimizer called from Python: compiled
    under the watch or before it (it holds no optimizer, so ``collect.recompile`` keeps
    that graph for the steps not collected), the collected steps run a graph of their own
    compiled with the taps, and record them."""
    net, opt, _ = build()
    loss_fn = tiny.loss_fn()

    def forward(a, c):
        return loss_fn(net(a), c)

    grad_fn = ms.jit(ms.value_and_grad(forward, None, opt.parameters))
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=STEPS + 1))
    if before:
        _, g = grad_fn(*batches[0])
        opt(g)
    track = [*CORE_METRICS, "activations"]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            for a, c in batches[1:]:
                _, g = grad_fn(a, c)
                opt(g)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    series = recorded(load_run(mon.run_dir))
    assert not any("computed none of them" in m for m in said), said
    assert {t.split("/")[1] for t in series} == {"fc1", "fc2"}  # the default: Dense layers
    assert all(s.steps.tolist() == [0, 3, 6] for s in series.values())
    assert all(np.all(np.isfinite(s.values)) for s in series.values())


def test_model_train_called_again_reuses_its_tapped_graph(tmp_path):
    """``model.train(1, ...)`` in a loop (GRAPH_MODE): the second call runs the graph the
    first compiled with the taps (the same ``GraphActivations``, its classes put on
    again) and records its steps as exactly; after the monitor, the classes are back."""
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net, opt, _ = build()
        model = Model(net, tiny.loss_fn(), opt)
        x, y = tiny.data(n=32 * STEPS)
        data = mds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(32)
        track = [*CORE_METRICS, "activations"]
        graphs, inputs = [], []
        with Monitor(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track) as mon:
            callback = mon.callback()
            for call in range(2):
                keep = Before(net, offset=call * STEPS)
                model.train(1, data, callbacks=[callback, keep], dataset_sink_mode=False)
                graphs.append(getattr(model.train_network, "_msmon_acts", (None, None))[1])
                inputs += [keep.kept[s] for s in sorted(keep.kept)]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert graphs[0] is not None and graphs[1] is graphs[0]
    assert graphs[0].reads == 4  # steps 3, 6 of the first call, 9, 12 of the second
    assert all(not hasattr(type(c), "_msmon_act_of") for _, c in net.cells_and_names())
    series = recorded(load_run(mon.run_dir))
    assert {s.steps.tolist() == [3, 6, 9, 12] for s in series.values()} == {True}
    fresh, _, _ = build()
    for i, (batch, weights) in enumerate(inputs):
        for p in fresh.trainable_params():
            p.set_data(ms.Tensor(weights[p.name]))
        for prefix, array in forward_reference(fresh, ms.Tensor(batch)).items():
            name = prefix.split("/")[1]
            if name == "act":
                continue  # the default selection: the Dense layers
            for stat, value in stats64(array).items():
                got = series[f"{prefix}/{stat}"].values[i]
                np.testing.assert_allclose(got, value, rtol=2e-6, atol=1e-30, err_msg=prefix)
