"""The single-layer set (issue 43, item 4): one layer breaks, the rest of the model is fine.

A held-out set, frozen (``bench/data/layers_curves.json.gz``) before the per-layer rule
was written or tuned, and never tuned on; ``tuning_specs()`` draws a disjoint set (other
seeds, other break steps and rates) to tune on. Each *base* is a healthy classifier
(three Gaussian blobs, ``bench/detect_runs.build_data``) of one model -- an MLP of four
Dense layers, the detection bench's conv net and transformer block -- trained with
Momentum or Adam (beta2 0.99, as the detection bench's
``adam_spike`` runs). Every run has a seed of its own, so the steps before a
run's break are healthy steps of their own, not copies of another run's.

The failures, each put into ONE weight (``*.weight``: Dense and Conv kernels, the
transformer's too; the first, a middle or the last of the model) at step ``at``:

* ``group_lr``: that weight's parameter group gets lr x ``rate`` from ``at`` on (a wrong
  lr for one group, as a layer-wise lr or a param-group typo makes it);
* ``adam_spike`` (Adam bases only): that weight's gradient x ``q`` over ``QUIET`` steps
  before ``at``, then back: its Adam second moment decayed alone, and its updates jump
  when the gradient returns (the quiet-then-back gradient of arXiv 2506.04805);
* ``penalty``: a mis-set regulariser on that weight, ``rate * ||W||^2`` added to the
  loss from ``at`` on;
* ``unfreeze``: the weight's group is frozen (lr 0) until ``at``, then trained with lr x
  ``rate`` (a frozen layer unfrozen with a big lr);
* ``corrupt``: at ``at``, ``rate`` x its spread of Gaussian noise added to the weight (a
  bad checkpoint shard, a stray in-place write).

Healthy runs (the false alarms are counted on them, and on every run's steps before its
break): each base unbroken (``control``), and each base with its middle weight frozen
until ``at`` and then trained at the base lr (``unfreeze_ok``: the usual way to unfreeze
a layer, which must stay quiet).

What is recorded per step is what a monitor collecting every step sees: the loss (the
penalty included), the global grad_norm of the gradients the optimizer got, each
parameter's gradient norm (the same gradients) and each parameter's update ratio
``||w - w_prev|| / ||w_prev||`` read from the Parameters after the step (float64 sums of
the float32 values; the corruption lands in the step it is written before).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from bench.detect_runs import Spec, build_data, build_network

SEED = 4344  # the held-out set's draws
TUNE_SEED = 5455  # the tuning set's
STEPS = 400
BREAK = (200, 280)  # where ``at`` is drawn
QUIET = 150  # adam_spike: quiet steps before ``at``
FAILURES = ("group_lr", "adam_spike", "penalty", "unfreeze", "corrupt")
HEALTHY = ("control", "unfreeze_ok")
MODELS = ("mlp", "conv", "transformer")
OPTS = {"momentum": 0.05, "adam": 3e-3}  # optimizer -> base lr
# (low, high) of each failure's rate, drawn log-uniformly per run; per optimizer family
RATES: dict[str, dict[str, tuple[float, float]]] = {
    "group_lr": {"momentum": (30.0, 300.0), "adam": (10.0, 100.0)},
    "adam_spike": {"adam": (0.003, 0.03)},  # q
    "penalty": {"momentum": (0.5, 5.0), "adam": (0.5, 5.0)},
    "unfreeze": {"momentum": (10.0, 100.0), "adam": (5.0, 50.0)},
    "corrupt": {"momentum": (1.0, 5.0), "adam": (1.0, 5.0)},
}
POSITIONS = ("first", "middle", "last")


def _draw(rng: np.random.Generator, low: float, high: float) -> float:
    return round(float(math.exp(rng.uniform(math.log(low), math.log(high)))), 4)


def specs(seed: int = SEED, positions: tuple[str, ...] = POSITIONS) -> list[Spec]:
    """Every run of the set drawn from ``seed``: per base (model x optimizer), the two
    healthy runs and each failure at each of ``positions``."""
    rng = np.random.default_rng(seed)
    out = []
    run_seed = seed * 10
    for model in MODELS:
        for opt, lr in OPTS.items():
            base = Spec(f"ly-{model}-{opt}", task="blobs", opt=opt, lr=lr, steps=STEPS, model=model)
            kinds = [(k, "middle") for k in HEALTHY]
            kinds += [(k, pos) for k in FAILURES if opt in RATES[k] for pos in positions]
            for kind, pos in kinds:
                run_seed += 1
                at = int(rng.integers(BREAK[0], BREAK[1] + 1))
                healthy = kind in HEALTHY
                rate = 1.0 if healthy else _draw(rng, *RATES[kind][opt])
                extra = {"beta2": 0.99} if opt == "adam" else {}
                extra["position"] = pos
                out.append(
                    dataclasses.replace(
                        base,
                        name=f"{base.name}-{kind}-{pos}-s{run_seed}",
                        failure=None if healthy else kind,
                        onset=None if healthy else at,
                        at=at,
                        rate=rate,
                        seed=run_seed,
                        extra={**extra, "kind": kind},
                    )
                )
    return out


def tuning_specs() -> list[Spec]:
    """The tuning set: the same design at other seeds, the middle weight only."""
    return specs(TUNE_SEED, ("middle",))


def network(spec: Spec, out_dim: int) -> Any:
    """The spec's model: the detection bench's conv net and transformer block, and for
    ``mlp`` four Dense layers (first, middle and last weights all distinct)."""
    if spec.model != "mlp":
        return build_network(spec, out_dim)
    from mindspore import nn

    return nn.SequentialCell(
        [
            nn.Dense(8, 32),
            nn.ReLU(),
            nn.Dense(32, 32),
            nn.ReLU(),
            nn.Dense(32, 32),
            nn.ReLU(),
            nn.Dense(32, out_dim),
        ]
    )


def target_index(spec: Spec, params: list) -> int:
    """Index (in ``params``) of the weight the spec's failure goes into."""
    weights = [i for i, p in enumerate(params) if p.name.endswith("weight") and len(p.shape) >= 2]
    pos = spec.extra["position"]
    return weights[{"first": 0, "middle": len(weights) // 2, "last": len(weights) - 1}[pos]]


def group_lrs(spec: Spec) -> tuple[list[float], list[float]]:
    """(the other parameters' per-step lr, the target's)."""
    n, lr, at = spec.steps, spec.lr, spec.at
    kind = spec.extra["kind"]
    base = [lr] * n
    if kind == "group_lr":
        return base, [lr if s < at else lr * spec.rate for s in range(n)]
    if kind in ("unfreeze", "unfreeze_ok"):
        return base, [0.0 if s < at else lr * spec.rate for s in range(n)]
    return base, base


def train(spec: Spec) -> dict[str, Any]:
    """Run ``spec`` for real in graph mode (the caller's mode restored after); per step
    ``loss``, ``grad_norm``, ``lr`` (the base lr), and per parameter (``names``) its
    gradient norm (``grads``: steps x parameters) and update ratio (``ratios``)."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return _train(spec)
    finally:
        ms.set_context(mode=mode)


def _train(spec: Spec) -> dict[str, Any]:
    import mindspore as ms
    from mindspore import nn, ops

    rng = np.random.default_rng(spec.seed)
    x, y, out_dim, _ = build_data(spec, rng)
    n = x.shape[0]
    broken = np.random.default_rng(spec.seed + 1000)  # the failure's own draws
    ms.set_seed(spec.seed)
    net = network(spec, out_dim)
    params = net.trainable_params()
    k = target_index(spec, params)
    target = params[k]
    others, mine = group_lrs(spec)
    groups = [{"params": p, "lr": lr} for p, lr in ((params[:k], others), ([target], mine),
              (params[k + 1 :], others)) if p]  # fmt: skip
    if spec.opt == "adam":
        opt = nn.Adam(groups, learning_rate=others, beta2=spec.extra["beta2"])
    else:
        opt = nn.Momentum(groups, learning_rate=others, momentum=0.9)
    ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward(a, b, pen):
        return ce(net(a), b) + pen * ops.reduce_sum(target * target)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    index = next(i for i, p in enumerate(opt.parameters) if p is target)

    @ms.jit
    def step(a, b, pen, gscale):
        loss, grads = grad_fn(a, b, pen)
        grads = tuple(g * gscale if i == index else g for i, g in enumerate(grads))
        opt(grads)
        return loss, grads

    @ms.jit
    def corrupt(noise):  # inside a graph: the compiled step holds the parameter
        ops.assign(target, target + noise)
        return noise

    one, zero = ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32)
    kind = spec.extra["kind"]
    names = [p.name for p in opt.parameters]
    prev = [p.asnumpy().astype(np.float32, copy=True) for p in opt.parameters]
    rec: dict[str, Any] = {"loss": [], "grad_norm": [], "lr": [], "grads": [], "ratios": []}
    for s in range(spec.steps):
        idx = rng.integers(0, n, size=spec.batch)
        pen = ms.Tensor(spec.rate, ms.float32) if kind == "penalty" and s >= spec.at else zero
        gscale = one
        if kind == "adam_spike" and spec.at - QUIET <= s < spec.at:
            gscale = ms.Tensor(spec.rate, ms.float32)
        if kind == "corrupt" and s == spec.at:
            w = target.asnumpy()
            noise = broken.normal(size=w.shape) * spec.rate * float(w.std())
            corrupt(ms.Tensor(noise.astype(np.float32)))
        loss, grads = step(ms.Tensor(x[idx]), ms.Tensor(y[idx]), pen, gscale)
        squares = np.array([float(np.sum(np.square(g.asnumpy(), dtype=np.float64))) for g in grads])
        now = [p.asnumpy().astype(np.float32, copy=True) for p in opt.parameters]
        ratios = []
        for w, w0 in zip(now, prev, strict=True):
            base = math.sqrt(float(np.sum(np.square(w0, dtype=np.float64))))
            delta = math.sqrt(float(np.sum(np.square(w.astype(np.float64) - w0))))
            ratios.append(delta / base if base > 0 else float("nan"))
        prev = now
        rec["loss"].append(float(loss.asnumpy()))
        rec["grad_norm"].append(math.sqrt(float(squares.sum())))
        rec["lr"].append(spec.lr)
        rec["grads"].append(np.sqrt(squares).tolist())
        rec["ratios"].append(ratios)
    rec["names"] = names
    return rec
