"""Compiled steps that are not collected run the graph with no activation taps in it;
collected steps run a graph of their own, compiled with them (``collect.acttaps``,
``collect.recompile``'s ``ACT_SUFFIX``). Each compiles once: two fresh compiles of the
step's graph for a whole run, whatever its length.

MindSpore's own ``_JitExecutor.compile`` and ``_CellGraphExecutor.compile``/``run`` are
watched from outside ours (installed before the monitor, so that our wrappers call
them): each step's graph phase, the Parameters that graph holds (MindSpore's
``get_params``), and whether the phase compiled anew. Real training, nothing mocked.
"""

from __future__ import annotations

import warnings

import mindspore as ms
import mindspore.dataset as mds
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from msmon_nb.collect.hooks import jit_api
from msmon_nb.collect.recompile import ACT_SUFFIX, SUFFIX, graph_params
from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.collect.test_activations import EVERY, STEPS, build, compiled_loop
from tests.support import tiny


class Seen:
    """Per graph run of the step: (phase, its graph's Parameter names); phases compiled
    anew for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str = "step") -> None:
        api = jit_api()
        self.runs: list[tuple[str, list[str]]] = []
        self.fresh: list[str] = []
        self.cells: list[object] = []  # the train cells watched (Model.train: its own)
        jit_compile = api._JitExecutor.compile
        cell_compile = api._CellGraphExecutor.compile
        cell_run = api._CellGraphExecutor.run
        seen = self

        def jcompile(executor, method_name, *args, **kwargs):
            known = set(api.ms_compile_cache)
            phase = jit_compile(executor, method_name, *args, **kwargs)
            if getattr(executor.fn, "__name__", "") == name:
                if phase not in known:
                    seen.fresh.append(phase)
                params = graph_params(executor._graph_executor, phase)
                seen.runs.append((phase, params))
            return phase

        def ccompile(executor, obj, *args, **kwargs):
            out = cell_compile(executor, obj, *args, **kwargs)
            if seen.watches(obj) and out[1]:
                seen.fresh.append(out[0])
            return out

        def crun(executor, obj, *args, phase="predict"):
            if seen.watches(obj):
                real = api._real_phase(phase, obj)
                seen.runs.append((real, graph_params(executor._graph_executor, real)))
            return cell_run(executor, obj, *args, phase=phase)

        monkeypatch.setattr(api._JitExecutor, "compile", jcompile)
        monkeypatch.setattr(api._CellGraphExecutor, "compile", ccompile)
        monkeypatch.setattr(api._CellGraphExecutor, "run", crun)

    def watches(self, obj: object) -> bool:
        return any(c is obj for c in self.cells) or (
            not self.cells and isinstance(obj, nn.TrainOneStepCell)
        )

    def check(self, collected: list[bool]) -> None:
        """Each step ran the graph its collect decision asks for, and the step's graphs
        compiled twice in all."""
        assert len(self.runs) == len(collected)
        for (phase, params), collect in zip(self.runs, collected, strict=True):
            assert (ACT_SUFFIX + SUFFIX in phase) == collect, phase
            held = any(n.startswith(("msmon_act_", "msmon_attn_")) for n in params)
            assert held == collect, (phase, params)
            assert params  # MindSpore told: the absence above is not an empty answer
        assert len(self.fresh) == 2, self.fresh  # the core graph and the collected one
        assert sum(ACT_SUFFIX in p for p in self.fresh) == 1


@pytest.fixture(params=["jit", "graph_cell"])
def shape(request):
    if request.param == "graph_cell":
        ms.set_context(mode=ms.GRAPH_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_steps_not_collected_run_the_graph_without_activation_taps(tmp_path, monkeypatch, shape):
    """(Training bit-identical and the values exact: test_activations.)"""
    seen = Seen(monkeypatch)
    _, _, step = compiled_loop(shape)
    x, y = tiny.data()
    track = [*CORE_METRICS, "activations"]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track)
    with Monitor(**cfg) as mon, mon.watch() as watch:
        for a, c in tiny.batches(x, y, steps=STEPS):
            step(a, c)
    seen.check([i % EVERY == 0 for i in range(STEPS)])
    assert watch.acts.graph.computed() == 3 * 2  # 2 Dense layers, steps 0, 3, 6


def test_model_train_steps_not_collected_run_the_graph_without_them(tmp_path, monkeypatch):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        seen = Seen(monkeypatch)
        net, opt, _ = build()
        model = Model(net, tiny.loss_fn(), opt)
        x, y = tiny.data(n=32 * STEPS)
        data = mds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(32)
        track = [*CORE_METRICS, "activations"]
        with Monitor(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track) as mon:
            seen.cells.append(model.train_network)
            model.train(1, data, callbacks=[mon.callback()], dataset_sink_mode=False)
            graph = model.train_network._msmon_acts[1]
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    seen.check([s % EVERY == 0 for s in range(1, STEPS + 1)])  # steps 3 and 6
    assert graph.computed() == 2 * 2 and graph.reads == 2


class Paired(nn.Cell):
    """A module whose output's first element is a pair: its activation tap cannot
    compile (a real fault, not a mock), the rest of the step can."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 16)

    def construct(self, x):
        y = self.fc(x)
        return (y, y), y


class OddNet(nn.Cell):
    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.pair = Paired()
        self.out = nn.Dense(16, 3)

    def construct(self, x):
        return self.out(self.pair(x)[1])


def odd_loop():
    net = OddNet()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_fn = tiny.loss_fn()

    def forward(a, c):
        return loss_fn(net(a), c)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(a, c):
        loss, g = grad_fn(a, c)
        opt(g)
        return loss

    return opt, step


def test_a_tap_that_cannot_compile_leaves_the_core_graph(tmp_path):
    """The collected steps' graph fails to compile: one warning, the step runs the graph
    the others run, grad_norm is still recorded, training is the twin's."""
    x, y = tiny.data()
    batches = list(tiny.batches(x, y, steps=STEPS))
    opt, step = odd_loop()
    track = [*CORE_METRICS, "activations"]
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, track_metrics=track,
               module_targets=["^pair$"])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            for a, c in batches:
                step(a, c)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert sum("activation/attention taps" in m for m in said) == 1, said
    assert not any("grad_norm/lr tap" in m for m in said), said
    run = load_run(mon.run_dir)
    assert run.scalars("train/grad_norm").steps.tolist() == [0, 3, 6]
    assert not [t for t in run.tags() if t.startswith("act/")]
    twin_opt, twin_step = odd_loop()
    for a, c in batches:
        twin_step(a, c)
    want = [p.asnumpy() for p in twin_opt.parameters]
    for got, expected in zip([p.asnumpy() for p in opt.parameters], want, strict=True):
        np.testing.assert_array_equal(got, expected)
