"""A tiny GAN in the MindSpore tutorial's functional shape (two ``value_and_grad``, two
Adams, PyNative) that records each optimizer's own series with ``mon.step``'s extra
scalars, as the collectors write them. From ``burst`` on, D's gradients reach its Adam
scaled by 1e4 (a scale not undone): D's grad_norm explodes, G's does not.

Self-contained (numpy and MindSpore only): a notebook test runs this module's source in
its kernel.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops

GRAD_D, GRAD_G = "opt/netd/grad_norm", "opt/netg/grad_norm"


def norm64(grads) -> float:
    """The reference: sqrt(sum ||g||^2) in float64 numpy."""
    return math.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))


def train_gan(mon, steps: int = 50, burst: int = 35) -> dict[str, list[float]]:
    """Train a tiny G and D for ``steps`` iterations; each optimizer's grad_norm, per step."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    net_g = nn.SequentialCell([nn.Dense(4, 16), nn.ReLU(), nn.Dense(16, 8)])
    net_d = nn.SequentialCell([nn.Dense(8, 16), nn.LeakyReLU(0.2), nn.Dense(16, 1)])
    bce = nn.BCEWithLogitsLoss()
    opt_d = nn.Adam(net_d.trainable_params(), learning_rate=2e-3, beta1=0.5)
    opt_g = nn.Adam(net_g.trainable_params(), learning_rate=1e-3, beta1=0.5)
    ones, zeros = ops.ones((16, 1), ms.float32), ops.zeros((16, 1), ms.float32)

    def d_loss(real, z):
        fake = ops.stop_gradient(net_g(z))
        return bce(net_d(real), ones) + bce(net_d(fake), zeros)

    def g_loss(z):
        return bce(net_d(net_g(z)), ones)

    grad_d = ms.value_and_grad(d_loss, None, opt_d.parameters)
    grad_g = ms.value_and_grad(g_loss, None, opt_g.parameters)
    rng = np.random.default_rng(0)
    seen: dict[str, list[float]] = {GRAD_D: [], GRAD_G: []}
    for step in range(steps):
        real = ms.Tensor(rng.normal(2.0, 0.5, (16, 8)).astype(np.float32))
        z = ms.Tensor(rng.normal(size=(16, 4)).astype(np.float32))
        loss_d, grads_d = grad_d(real, z)
        if step >= burst:
            grads_d = tuple(g * 1e4 for g in grads_d)
        opt_d(grads_d)
        loss_g, grads_g = grad_g(z)
        opt_g(grads_g)
        values = {
            "opt/netd/loss": float(loss_d.asnumpy()),
            "opt/netg/loss": float(loss_g.asnumpy()),
            GRAD_D: norm64(grads_d),
            GRAD_G: norm64(grads_g),
            "opt/netd/learning_rate": 2e-3,
            "opt/netg/learning_rate": 1e-3,
        }
        seen[GRAD_D].append(values[GRAD_D])
        seen[GRAD_G].append(values[GRAD_G])
        mon.step(batch_size=16, **values)
    return seen
