"""The blame bench's detection set: the held-out detection runs, their failure put into one
known parameter.

``bench/detect_runs.test_specs()`` is the detection benchmark's held-out set. Its
``explosion`` runs (the lr x ``rate`` from step ``at``) and ``adam_spike`` runs (every
gradient quiet, x ``q``, over ``[at, back)``, then back) hit every layer at once, so no
layer "started" them. Here each is re-run as it is (model: mlp, conv or transformer; its
data, optimizer, schedule, batch size and seed, from ``detect_runs``' own builders) but
with its failure put into ONE known parameter k:

- explosion: k's parameter group gets the spec's lr jump (x ``rate`` from ``at``), the
  other parameters keep the spec's schedule. That is the spec's failure (an lr jump, not
  a gradient growth) narrowed to one group, the bench's ``group lr`` failure at the
  held-out runs' factors (x300 Nesterov, x100 AdamW beta2 0.95);
- adam_spike: the spec's gradient scale (``detect_runs.grad_scale``: quiet, then back,
  at once or over ``ramp`` steps) on k's gradient only: k's Adam second moment decays
  alone, and k's updates are the ones that jump when its gradient returns.

k: the first, middle and last weight (``*.weight``: Dense and Conv kernels, not biases
or LayerNorm) of the model (the MLP has two). Each run trains through ``mon.step`` over a
jit-compiled step that returns the gradients the optimizer got, with the default ring;
it stops at its first gradient or loss alert (``BLAME_KINDS``) from the spec's onset on
(the first step its values show the failure), which is the alert judged: the rows after
it are never read, so stopping there scores the same as training on. Nothing in
``msmon_nb`` is tuned on these runs (they are held out).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bench.detect_runs import (
    Spec,
    build_data,
    build_loss,
    build_network,
    build_optimizer,
    grad_scale,
    lr_list,
    test_specs,
)
from msmon_nb.config.cards import BLAME_KINDS
from msmon_nb.monitor import Monitor

DETECTION_FAILURES = ("explosion", "adam_spike")


def detection_plan(smoke: bool) -> list[tuple[Spec, int]]:
    """(spec, k) of every detection-set run: k indexes the model's weights (first,
    middle, last). ``smoke``: the MLP explosion run, its first weight."""
    specs = [s for s in test_specs() if s.failure in DETECTION_FAILURES]
    if smoke:
        return [(next(s for s in specs if s.failure == "explosion" and s.model == "mlp"), 0)]
    return [(spec, k) for spec in specs for k in dict.fromkeys(_picks(_weights(spec)))]


def _picks(count: int) -> tuple[int, int, int]:
    return 0, count // 2, count - 1


def _weights(spec: Spec) -> int:
    """How many weights (``*.weight``) the spec's model has (mlp 2, conv 3, transformer
    5), counted on the model itself so the picks follow it if it changes."""
    return len(_weight_params(build_network(spec, 1)))


def _weight_params(net: Any) -> list[Any]:
    return [p for p in net.trainable_params() if p.name.endswith("weight")]


def detection_run(spec: Spec, k: int, base: str):
    """Train ``spec`` with its failure in weight ``k`` only (module docstring); (the
    target's name, every collected step's (step, names, norms), the judged alert). In
    graph mode over a ``WithLossCell``, as ``detect_runs.train`` runs its many runs in one
    process; the caller's mode is restored after. (A PyNative ``ms.jit`` over a plain
    loss closure, run after the bench's PyNative sets, once failed in the graph parser:
    NameError on the closure's loss function.)"""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return _run(spec, k, base)
    finally:
        ms.set_context(mode=mode)


def _run(spec: Spec, k: int, base: str):
    import mindspore as ms
    from mindspore import nn

    rng = np.random.default_rng(spec.seed)
    x, y, out_dim, _ = build_data(spec, rng)
    n = x.shape[0]
    ms.set_seed(spec.seed)
    net = build_network(spec, out_dim)
    params = net.trainable_params()
    target = _weight_params(net)[k]
    healthy = lr_list(dataclasses.replace(spec, failure=None))
    if spec.failure == "explosion":  # k's group alone gets the jump; order kept
        at = next(i for i, p in enumerate(params) if p is target)
        parts = [params[:at], [target], params[at + 1 :]]
        lrs = [healthy, lr_list(spec), healthy]
        groups = [{"params": p, "lr": lr} for p, lr in zip(parts, lrs, strict=True) if p]
        opt = build_optimizer(spec, groups, healthy)
    else:
        opt = build_optimizer(spec, params, lr_list(spec))
    index = next(i for i, p in enumerate(opt.parameters) if p is target)
    forward = nn.WithLossCell(net, build_loss(spec))
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(a, b, gscale):
        loss, grads = grad_fn(a, b)
        grads = tuple(g * gscale if i == index else g for i, g in enumerate(grads))
        opt(grads)
        return loss, grads

    one = ms.Tensor(1.0, ms.float32)
    rows: list[tuple[int, list[str], np.ndarray]] = []
    judged: list[Any] = []
    with Monitor(save_dir=base, blame={"detail_steps": 0}) as mon:
        for s in range(spec.steps):
            idx = rng.integers(0, n, size=spec.batch)
            g = grad_scale(spec, s)  # 1 but in adam_spike runs
            gscale = one if g == 1.0 else ms.Tensor(g, ms.float32)
            loss, grads = step(ms.Tensor(x[idx]), ms.Tensor(y[idx]), gscale)
            mon.step(loss=loss, grads=grads, params=opt.parameters)
            kept = mon.collector.param_norms
            if kept is not None:
                rows.append(kept)
            judged = [a for a in mon.alerts if a.kind in BLAME_KINDS and a.step >= spec.onset]
            if judged:
                break
    return target.name, rows, (judged[0] if judged else None)
