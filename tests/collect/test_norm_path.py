"""The device path of grad_norm: one reduction where the gradients live, one scalar to
the host per collected step, read one step late and recorded at its own step. Forced on
CPU with MSMON_GRAD_NORM_PATH=device; every byte MindSpore copies to the host is counted
at ``Tensor.asnumpy`` and ``Tensor.item`` (the two ways msmon reads a tensor: ``item`` for
one-element tensors), and graph launches at ``_JitExecutor.__call__``."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from msmon_nb.collect.hooks import compile_cache, jit_api
from msmon_nb.monitor import Monitor
from tests.collect.test_watch import make_loop
from tests.support import tiny


class Meter:
    """Bytes copied to the host and jit launches, counted only while ``on``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.bytes: list[int] = []
        self.launches = 0
        asnumpy = ms.Tensor.asnumpy
        item = ms.Tensor.item
        executor = jit_api()._JitExecutor
        call = executor.__call__
        meter = self

        def counting_asnumpy(tensor):
            out = asnumpy(tensor)
            if meter.on:
                meter.bytes.append(int(out.nbytes))
            return out

        def counting_item(tensor, *args):
            out = item(tensor, *args)
            if meter.on:
                meter.bytes.append(int(tensor.size) * int(tensor.itemsize))
            return out

        def counting_call(self_, *args, **kwargs):
            if meter.on:
                meter.launches += 1
            return call(self_, *args, **kwargs)

        monkeypatch.setattr(ms.Tensor, "asnumpy", counting_asnumpy)
        monkeypatch.setattr(ms.Tensor, "item", counting_item)
        monkeypatch.setattr(executor, "__call__", counting_call)

    def measure(self, fn, *args, **kwargs) -> tuple[int, int]:
        """(bytes copied, graph launches) while ``fn`` runs."""
        self.bytes.clear()
        self.launches = 0
        self.on = True
        try:
            fn(*args, **kwargs)
        finally:
            self.on = False
        return sum(self.bytes), self.launches


def grad_norm_series(mon: Monitor) -> tuple[list[int], list[float]]:
    series = mon.series["train/grad_norm"]
    return list(series.steps), list(series.values)


def test_device_path_one_scalar_per_collected_step(tmp_path, monkeypatch):
    monkeypatch.setenv("MSMON_GRAD_NORM_PATH", "device")
    x, y, _net, opt, grad_fn = make_loop()
    meter = Meter(monkeypatch)
    norms, cache_sizes = [], []
    mon = Monitor(save_dir=str(tmp_path), track_metrics=["loss", "grad_norm"])
    for step, (a, b) in enumerate(tiny.batches(x, y, steps=6)):
        loss, grads = grad_fn(a, b)
        norms.append(tiny.numpy_global_norm(grads))
        opt(grads)
        copied, launches = meter.measure(mon.step, loss=loss, grads=grads)
        # the loss now, and (from the second step on) the previous step's norm: 4 bytes each
        assert copied == (4 if step == 0 else 8), (step, meter.bytes)
        assert launches == 1  # the whole norm is one graph launch
        steps, _ = grad_norm_series(mon) if step else ([], [])
        assert steps == list(range(step))  # one step late, recorded at its own step
        cache_sizes.append(len(compile_cache() or ()))
    copied, launches = meter.measure(mon.close)
    assert (copied, launches) == (4, 0)  # the last pending norm is flushed at close
    steps, values = grad_norm_series(mon)
    assert steps == list(range(6))
    np.testing.assert_allclose(values, norms, rtol=1e-4)
    assert len(set(cache_sizes)) == 1  # compiled once for this gradient structure


def test_device_path_reads_at_the_next_step_between_collections(tmp_path, monkeypatch):
    """Collected every 3rd step: the norm of step 0 is read at step 1 (not collected),
    so one scalar per collected step whatever the interval."""
    monkeypatch.setenv("MSMON_GRAD_NORM_PATH", "device")
    x, y, _net, opt, grad_fn = make_loop()
    meter = Meter(monkeypatch)
    norms, per_step = {}, []
    with Monitor(save_dir=str(tmp_path), track_metrics=["grad_norm"], log_interval=3) as mon:
        for step, (a, b) in enumerate(tiny.batches(x, y, steps=8)):
            loss, grads = grad_fn(a, b)
            if step % 3 == 0:
                norms[step] = tiny.numpy_global_norm(grads)
            opt(grads)
            per_step.append(meter.measure(mon.step, loss=loss, grads=grads)[0])
    assert per_step == [0, 4, 0, 0, 4, 0, 0, 4]
    steps, values = grad_norm_series(mon)
    assert steps == [0, 3, 6]
    np.testing.assert_allclose(values, [norms[s] for s in steps], rtol=1e-4)


def test_host_path_copies_every_gradient(tmp_path, monkeypatch):
    monkeypatch.setenv("MSMON_GRAD_NORM_PATH", "host")
    x, y, _net, opt, grad_fn = make_loop()
    grad_bytes = sum(int(np.prod(p.shape)) * 4 for p in opt.parameters)
    meter = Meter(monkeypatch)
    norms = []
    with Monitor(save_dir=str(tmp_path), track_metrics=["loss", "grad_norm"]) as mon:
        for a, b in tiny.batches(x, y, steps=4):
            loss, grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
            copied, launches = meter.measure(mon.step, loss=loss, grads=grads)
            assert (copied, launches) == (4 + grad_bytes, 0)
            assert grad_norm_series(mon)[0][-1] == len(norms) - 1  # same step, no delay
    np.testing.assert_allclose(grad_norm_series(mon)[1], norms, rtol=1e-4)


def test_device_path_under_watch_counts_no_extra_step(tmp_path, monkeypatch):
    """The norm's own jit launch inside a watched loop is the monitor's work, not a
    jit step of the user's: the step count and the values stay exact."""
    monkeypatch.setenv("MSMON_GRAD_NORM_PATH", "device")
    x, y, _net, opt, grad_fn = make_loop()
    norms = []
    with Monitor(save_dir=str(tmp_path)) as mon, mon.watch():
        for a, b in tiny.batches(x, y, steps=5):
            _loss, grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
    assert mon.step_count == 5
    steps, values = grad_norm_series(mon)
    assert steps == list(range(5))
    np.testing.assert_allclose(values, norms, rtol=1e-4)
    assert not [a for a in mon.alerts if a.kind == "step_order"]
