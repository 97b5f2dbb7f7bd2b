"""Optimizer state (``optimizer_state`` in ``track_metrics``) on real CPU training.

The recorded moment norms are compared (rtol 1e-4) with a float64 numpy computation of
the optimizer's moments read apart, through the attribute each MindSpore optimizer
keeps them in, at exactly the collected steps. Both reduction paths run: the host one
(the CPU default) and the compiled device graph (the Ascend/GPU default, forced here
with ``MSMON_OPTSTATE_PATH=device``).
"""

import re
import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.train import Callback, Model

from msmon_nb.collect.optstate import PATH_ENV, moment_tag
from msmon_nb.config import CORE_METRICS, MonitorConfig
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.metrics.charts import MAX_LINES, plan_charts
from msmon_nb.monitor import Monitor
from tests.support import tiny

STEPS = 10
TRACK = [*CORE_METRICS, "optimizer_state"]

# optimizer -> (its constructor, {moment name in our tags: the attribute MindSpore keeps it in})
OPTIMIZERS = {
    "adam": (
        lambda p: nn.Adam(p, learning_rate=0.01),
        {"moment1": "moment1", "moment2": "moment2"},
    ),
    "adamweightdecay": (
        lambda p: nn.AdamWeightDecay(p, learning_rate=0.01, weight_decay=0.01),
        {"moment1": "moments1", "moment2": "moments2"},
    ),
    "momentum": (
        lambda p: nn.Momentum(p, learning_rate=0.05, momentum=0.9),
        {"momentum": "moments"},
    ),
    "sgd_momentum": (lambda p: nn.SGD(p, learning_rate=0.05, momentum=0.9), {"momentum": "accum"}),
}


def moments_read_apart(opt, attrs, select=lambda name: True):
    """{tag: float64 norm} from the optimizer's own moment attributes."""
    out = {}
    for moment, attr in attrs.items():
        for param, state in zip(opt.parameters, getattr(opt, attr), strict=True):
            if select(param.name):
                value = state.asnumpy().astype(np.float64)
                out[moment_tag(param.name, moment)] = float(np.sqrt((value**2).sum()))
    return out


def recorded(run):
    """{tag: (steps, values)} of every moment-norm series in the run."""
    return {
        tag: run.scalars(tag)
        for tag in run.tags()
        if re.fullmatch(r"param/.+/(moment1|moment2|momentum)_norm", tag)
    }


def check_against(run, expected_by_step):
    """Every expected (step, tag) recorded with its reference value, and nothing else."""
    series = recorded(run)
    tags = set().union(*(set(v) for v in expected_by_step.values()))
    assert set(series) == tags
    steps = sorted(expected_by_step)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = [expected_by_step[step][tag] for step in steps]
        np.testing.assert_allclose(s.values, want, rtol=1e-4, err_msg=tag)
        assert np.all(np.isfinite(s.values)) and s.values.max() > 0, tag


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    monkeypatch.setenv(PATH_ENV, request.param)
    return request.param


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_explicit_loop_moment_norms_at_collected_steps(tmp_path, name, path):
    make, attrs = OPTIMIZERS[name]
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = make(net.trainable_params())
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x, y = tiny.data()
    expected = {}
    with Monitor(save_dir=str(tmp_path), log_interval=3, track_metrics=TRACK) as mon:
        for step, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
            loss, grads = grad_fn(a, b)
            opt(grads)
            mon.step(loss=loss, grads=grads, optimizer=opt)
            if step % 3 == 0:
                expected[step] = moments_read_apart(opt, attrs)
    run = load_run(mon.run_dir)
    check_against(run, expected)
    assert sorted(expected) == [0, 3, 6, 9]
    assert mon.collector.optimizer_reads == 4  # one reduction per collected step, none between
    assert len(recorded(run)) == len(attrs) * 4  # 4 parameters: 2 weights, 2 biases


def test_lamb_moments_read_though_its_kernel_has_no_cpu_version(tmp_path, path):
    """nn.Lamb's update op does not run on the CPU ("Unsupported op [Lamb] on CPU"), so
    its moments are filled with known values instead of trained, then read."""
    net = tiny.mlp()
    opt = nn.Lamb(net.trainable_params(), learning_rate=0.01)
    rng = np.random.default_rng(7)
    attrs = {"moment1": "moments1", "moment2": "moments2"}
    expected = {}
    with Monitor(save_dir=str(tmp_path), log_interval=2, track_metrics=TRACK) as mon:
        for step in range(4):
            for attr in attrs.values():
                for state in getattr(opt, attr):
                    fill = rng.normal(scale=step + 1, size=state.shape).astype(np.float32)
                    ops.assign(state, ms.Tensor(fill))  # in place, as an update writes
            mon.step(loss=1.0, optimizer=opt)
            if step % 2 == 0:
                expected[step] = moments_read_apart(opt, attrs)
    check_against(load_run(mon.run_dir), expected)


def test_watched_loop_with_mindformers_target_and_invert(tmp_path, path):
    """A MindFormers block selects the parameters: ``target`` + ``invert`` keep the weights."""
    config = MonitorConfig.from_dict(
        {
            "monitor_config": {
                "dump_path": str(tmp_path),
                "step_interval": 2,
                "target": ["bias"],
                "invert": True,
                "optimizer_state_format": ["tensorboard"],
            }
        }
    )
    assert "optimizer_state" in config.track_metrics
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x, y = tiny.data()
    expected = {}
    with Monitor(config) as mon, mon.watch():
        for step, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
            _loss, grads = grad_fn(a, b)
            opt(grads)
            if step % 2 == 0:  # the watch records the step when opt(grads) returns
                expected[step] = moments_read_apart(
                    opt, {"moment1": "moments1", "moment2": "moments2"}, lambda n: "bias" not in n
                )
    run = load_run(mon.run_dir)
    check_against(run, expected)
    assert set(recorded(run)) == {
        "param/0.weight/moment1_norm",
        "param/0.weight/moment2_norm",
        "param/2.weight/moment1_norm",
        "param/2.weight/moment2_norm",
    }
    assert mon.step_count == STEPS  # every step counted, every other one collected
    assert mon.collector.optimizer_reads == STEPS // 2


def test_jit_step_finds_its_optimizer_and_our_graph_is_no_step(tmp_path, path):
    """The optimizer runs inside a compiled step, so the watch finds it through the step
    function; with the device path our own compiled reduction runs inside the watch and
    must not count as a step of the user's."""
    net = tiny.mlp(seed=3)
    loss_fn = tiny.loss_fn()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    x, y = tiny.data()
    expected = {}
    with Monitor(save_dir=str(tmp_path), log_interval=4, track_metrics=TRACK) as mon, mon.watch():
        for step, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
            train_step(a, b)
            if step % 4 == 0:
                expected[step] = moments_read_apart(opt, OPTIMIZERS["adam"][1])
    run = load_run(mon.run_dir)
    # a jit step ends when the next begins (or the watch ends): moments read after the
    # step are those recorded for it, as nothing ran in between
    check_against(run, expected)
    assert mon.step_count == STEPS
    assert run.scalars("train/grad_norm").steps.tolist() == [0, 4, 8]


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_hand_driven_train_cell(tmp_path, mode, path):
    """In GRAPH_MODE the optimizer runs inside the train cell's graph: found in the cell."""
    x, y = tiny.data()
    ms.set_context(mode=mode)
    try:
        net = tiny.mlp(seed=3)
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
        train = nn.TrainOneStepCell(nn.WithLossCell(net, tiny.loss_fn()), opt)
        expected = {}
        cfg = MonitorConfig(save_dir=str(tmp_path), log_interval=2, track_metrics=TRACK)
        with Monitor(cfg) as mon, mon.watch():
            for step, (a, b) in enumerate(tiny.batches(x, y, steps=STEPS)):
                train(a, b)
                if step % 2 == 0:
                    expected[step] = moments_read_apart(opt, {"momentum": "moments"})
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    check_against(load_run(mon.run_dir), expected)
    assert mon.step_count == STEPS


class MomentsAtStepEnd(Callback):
    """The reference for Model.train: the moments read after our callback, same step."""

    def __init__(self, attrs, every):
        super().__init__()
        self.attrs, self.every, self.by_step = attrs, every, {}

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        if cb.cur_step_num % self.every == 0:
            self.by_step[cb.cur_step_num] = moments_read_apart(cb.optimizer, self.attrs)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_model_train_reads_the_callbacks_optimizer(tmp_path, mode, path):
    x, y = tiny.data(n=32 * 8)
    data = mds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(32)
    ms.set_context(mode=mode)
    try:
        net = tiny.mlp(seed=3)
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
        model = Model(net, loss_fn=tiny.loss_fn(), optimizer=opt)
        reference = MomentsAtStepEnd({"momentum": "moments"}, every=3)
        with Monitor(save_dir=str(tmp_path), log_interval=3, track_metrics=TRACK) as mon:
            model.train(2, data, callbacks=[mon.callback(), reference], dataset_sink_mode=False)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert sorted(reference.by_step) == [3, 6, 9, 12, 15]  # MindSpore numbers steps from 1
    check_against(load_run(mon.run_dir), reference.by_step)
    assert mon.collector.optimizer_reads == 5


def test_sgd_without_momentum_warns_once_and_training_goes_on(tmp_path):
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x, y = tiny.data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), track_metrics=TRACK) as mon, mon.watch():
            for a, b in tiny.batches(x, y, steps=STEPS):
                _loss, grads = grad_fn(a, b)
                opt(grads)
    ours = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1, ours
    assert "optimizer_state: SGD without momentum keeps no moments" in ours[0]
    assert "training goes on" in ours[0]
    run = load_run(mon.run_dir)
    assert recorded(run) == {}
    assert run.scalars("train/loss").steps.tolist() == list(range(STEPS))
    assert run.status == "finished"


def test_missing_optimizer_is_named_once_with_the_fix(tmp_path):
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    x, y = tiny.data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), track_metrics=TRACK) as mon:
            for a, b in tiny.batches(x, y, steps=4):
                loss, grads = grad_fn(a, b)
                opt(grads)
                mon.step(loss=loss, grads=grads)
    ours = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(ours) == 1 and "mon.step(..., optimizer=opt)" in ours[0], ours
    assert load_run(mon.run_dir).scalars("train/loss").steps.tolist() == [0, 1, 2, 3]


def test_mindformers_optimizer_state_format_maps_without_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = MonitorConfig.from_dict(
            {"monitor_config": {"optimizer_state_format": "log", "target": ["layers.0"]}}
        )
    assert [w for w in caught if issubclass(w.category, MonitorWarning)] == []
    assert config.track_metrics == [*CORE_METRICS, "optimizer_state"]
    assert config.param_targets == ["layers.0"]
    off = MonitorConfig.from_dict({"monitor_config": {"optimizer_state_format": None}})
    assert "optimizer_state" not in off.track_metrics


def test_many_parameters_make_one_capped_chart_per_moment():
    tags = ["train/loss", "train/grad_norm"]
    for layer in range(40):
        for moment in ("moment1", "moment2"):
            tags.append(moment_tag(f"layers.{layer}.attention.wq.weight", moment))
        tags.append(f"param/layers.{layer}.attention.wq.weight/weight_norm")
    charts = [c for c in plan_charts(tags) if c.title.startswith("param")]
    assert [c.title.split(" (")[0] for c in charts] == [
        "param moment1_norm",
        "param moment2_norm",
        "param weight_norm",
    ]
    assert all(len(c.tags) == MAX_LINES for c in charts)
    assert all(c.title.endswith(f"(first {MAX_LINES} of 40)") for c in charts)
