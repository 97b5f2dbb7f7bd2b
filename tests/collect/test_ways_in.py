"""A MindSpore without one of the attributes watch() attaches to (simulated by deleting
it): one MonitorWarning naming what is not observed, the loop runs, mon.step works."""

import warnings

import mindspore as ms
import pytest
from mindspore import nn

from msmon_nb.collect.hooks import find_ways_in, ways_in
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.support import tiny


def hooked_attributes():
    """Every attribute this MindSpore's ways in replace (or read) that can be deleted."""
    return [
        target
        for way in find_ways_in().values()
        for target in way.targets
        if target.name in vars(target.owner)
    ]


def make_loop():
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)

    def forward(a, b):
        return loss_fn(net(a), b)

    return x, y, opt, ms.value_and_grad(forward, None, opt.parameters)


def enter_without(monkeypatch, target, mon):
    """Start a watch while ``target`` is missing; MindSpore's own code calls it, so it
    comes back before the loop runs (we must not have attached to it meanwhile)."""
    monkeypatch.delattr(target.owner, target.name)
    ways = find_ways_in()
    covered = all(w.missing_message("") is None for w in ways.values())
    watch = mon.watch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.__enter__()
    monkeypatch.undo()
    return watch, [w for w in caught if issubclass(w.category, MonitorWarning)], covered


@pytest.mark.parametrize("target", hooked_attributes(), ids=lambda t: t.path)
def test_missing_attribute_warns_once_and_the_loop_runs(tmp_path, monkeypatch, target):
    x, y, opt, grad_fn = make_loop()  # built before the watch
    with Monitor(save_dir=str(tmp_path)) as mon:
        watch, warned, covered = enter_without(monkeypatch, target, mon)
        done = 0
        try:
            for a, b in tiny.batches(x, y, steps=6):
                _, grads = grad_fn(a, b)
                opt(grads)
                done += 1
        finally:
            watch.__exit__(None, None, None)
        assert done == 6
        if covered:  # another place this MindSpore has does the same job
            assert warned == []
            assert mon.series.get("train/grad_norm") is not None
        else:
            assert len(warned) == 1, [str(w.message) for w in warned]
            message = str(warned[0].message)
            assert target.path in message and "observed" in message
        mon.step(loss=1.0, grad_norm=2.0, step=100)  # the explicit API still works
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist()[-1] == 100
    assert run.status == "finished"


def test_jit_step_without_compile_cache_names_the_fix(tmp_path, monkeypatch):
    from msmon_nb.collect.hooks import jit_api

    x, y, opt, grad_fn = make_loop()

    @ms.jit
    def train_step(a, b):
        loss, grads = grad_fn(a, b)
        opt(grads)
        return loss

    batches = list(tiny.batches(x, y, steps=5))
    train_step(*batches[0])  # compiled before the watch: its graph has no tap
    cache = jit_api().ms_compile_cache
    with Monitor(save_dir=str(tmp_path)) as mon:
        watch, _, _ = enter_without(
            monkeypatch, next(t for t in hooked_attributes() if t.name == "ms_compile_cache"), mon
        )
        with pytest.warns(MonitorWarning, match=r"grad_norm is not observed.*mm\.global_norm"):
            for a, b in batches[1:]:
                train_step(a, b)
        watch.__exit__(None, None, None)
    assert cache is jit_api().ms_compile_cache
    run = load_run(mon.run_dir)
    assert run.scalars("train/loss").steps.tolist() == [0, 1, 2, 3]


def test_ways_in_report_on_this_version():
    report = ways_in()
    for name in ("forward", "backward", "optimizer", "cell", "jit", "compile_cache", "model"):
        assert report[name]["available"], (ms.__version__, name, report[name])
