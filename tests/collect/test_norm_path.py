"""The device path of grad_norm: one reduction where the gradients live, one scalar to
the host. Forced on CPU with MSMON_GRAD_NORM_PATH=device; bytes to the host counted."""

import numpy as np
import pytest

import msmon_nb.collect.values as values
from msmon_nb.monitor import Monitor
from tests import tiny
from tests.collect.test_watch import make_loop


def copied(monkeypatch):
    """Count bytes every to_numpy call (the one way msmon copies tensors out) returns."""
    counts = []
    inner = values.to_numpy

    def counting(value):
        out = inner(value)
        counts.append(out.nbytes)
        return out

    monkeypatch.setattr(values, "to_numpy", counting)
    monkeypatch.setattr("msmon_nb.collect.tensors.to_numpy", counting)
    return counts


@pytest.mark.parametrize("path", ["device", "host"])
def test_bytes_to_host_per_collected_step(tmp_path, monkeypatch, path):
    monkeypatch.setenv("MSMON_GRAD_NORM_PATH", path)
    x, y, _net, opt, grad_fn = make_loop()
    grad_bytes = sum(int(np.prod(p.shape)) * 4 for p in opt.parameters)
    norms = []
    with Monitor(save_dir=str(tmp_path), track_metrics=["loss", "grad_norm"]) as mon:
        for a, b in tiny.batches(x, y, steps=5):
            loss, grads = grad_fn(a, b)
            norms.append(tiny.numpy_global_norm(grads))
            opt(grads)
            counts = copied(monkeypatch)
            mon.step(loss=loss, grads=grads)
            monkeypatch.undo()
            monkeypatch.setenv("MSMON_GRAD_NORM_PATH", path)
            if path == "device":
                assert sum(counts) == 8  # the loss and the norm: one float32 each
            else:
                assert sum(counts) == 4 + grad_bytes
    np.testing.assert_allclose(mon.series["train/grad_norm"].values, norms, rtol=1e-5)
