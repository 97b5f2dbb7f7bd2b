"""The "converged, then broken" set (issue 43): runs that reach their floor, then break.

A held-out set, frozen before any rule changed for issue 43 and never tuned on. Each
*base* is a healthy run that converges -- a low-noise MLP regression to its noise floor,
an MLP, a conv net and a transformer block memorising 64 samples, fine-tuning from
trained (converged) weights on a related task; SGD, Momentum, Adam and AdamW -- and is
trained once unbroken (the *control*: its false alarms are the set's false alarms) and
once per failure kind, broken at a step drawn at random after the control converged:

* ``grad_compound``: every gradient x ``rate`` ** (steps since ``at`` + 1) before the
  optimizer sees it (a loss scale applied and never undone, growing each step);
* ``lr_jump``: the lr x ``rate`` from ``at`` on;
* ``lr_ramp``: the lr x ``rate`` ** (steps since ``at`` + 1) (a schedule gone wrong);
* ``input_drift``: the inputs shifted along one fixed random direction by ``rate`` x
  their spread per step since ``at`` (a sensor or preprocessing that drifts);
* ``corrupt_shard``: for ``SHARD`` steps from ``at`` on, a share ``rate`` of every
  batch comes from a corrupt shard (inputs of the right spread, random labels/targets);
* ``reinit``: at ``at``, the first weight (the first Dense or Conv kernel; the
  transformer's qkv) re-drawn at random with its initial spread (a layer re-initialised
  by a bad checkpoint load or a stray ``init``).

Before ``at`` a broken run is its control, value for value (the same graph, data draws
and lr); the failure's own random draws come from a generator of their own. ``onset`` is
``at``: the first step whose recorded values show the failure. The break step and the
rate are drawn from ``numpy.random.default_rng(SEED)`` in ``specs()``, once, within the
ranges below; they were not chosen by looking at any rule's output.

``train`` records what ``bench/detect_runs.train`` records (loss, grad_norm, lr, Adam's
moment norms), so ``bench/detect_score`` scores these runs as it scores the detection set.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from bench.detect_runs import (
    Spec,
    build_data,
    build_loss,
    build_network,
    build_optimizer,
    lr_list,
)

FAILURES = ("grad_compound", "lr_jump", "lr_ramp", "input_drift", "corrupt_shard", "reinit")
# the failures whose loss cannot pass 10x its best before the failure's first step: a
# corrupt batch or a re-drawn layer lifts a loss at its floor past 10x at once, so a lead
# before the blow-up is not theirs to have (their delay is what counts)
ABRUPT = ("corrupt_shard", "reinit")
SEED = 4343
STEPS = 1000  # every run: the break at 600-750 leaves 250-400 steps to break in
BREAK = (600, 750)  # where the break step is drawn; every control is at its floor by 600
SHARD = 100  # steps the corrupt shard lasts
RATES: dict[str, tuple[float, float]] = {
    "grad_compound": (1.03, 1.06),
    "lr_jump": (5.0, 20.0),
    "lr_ramp": (1.03, 1.06),
    "input_drift": (0.005, 0.02),
    "corrupt_shard": (0.1, 0.3),
    "reinit": (1.0, 1.0),
}

_MEM = {"samples": 64}


# the tuning set's seeds are these + TUNING_OFFSET (530+), its names start "rt-", and its
# breaks are drawn from SEED + TUNING_OFFSET: the same kinds of run, other draws
TUNING_OFFSET = 100


def bases(tuning: bool = False) -> list[Spec]:
    """The healthy runs that converge (seeds 430+, none shared with bench/detect_runs);
    ``tuning``: the tuning set's (``TUNING_OFFSET``), for tuning rules on, never the
    held-out set."""
    held_out = _bases()
    if not tuning:
        return held_out
    return [
        dataclasses.replace(
            b,
            name="rt-" + b.name[3:].replace(f"-s{b.seed}", f"-s{b.seed + TUNING_OFFSET}"),
            seed=b.seed + TUNING_OFFSET,
        )
        for b in held_out
    ]


def _bases() -> list[Spec]:
    pre_adam = {"steps": 600, "lr": 1e-2, "opt": "adam"}
    return [
        Spec("rl-regress-mlp-sgd-s430", task="regress", opt="sgd", lr=0.3, seed=430,
             extra={"noise": 0.02}),
        Spec("rl-regress-mlp-momentum-s431", task="regress", opt="momentum", lr=0.05,
             seed=431, extra={"noise": 0.02}),
        Spec("rl-memorise-mlp-adam-regress-s432", task="regress", opt="adam", lr=1e-2,
             batch=16, seed=432, extra=_MEM),
        Spec("rl-memorise-mlp-adamw-blobs-s433", opt="adamw", lr=1e-2, batch=16, seed=433,
             extra=_MEM),
        Spec("rl-memorise-conv-momentum-blobs-s434", model="conv", opt="momentum",
             lr=0.03, batch=16, seed=434, extra=_MEM),
        Spec("rl-memorise-transformer-adam-regress-s435", model="transformer",
             task="regress", opt="adam", lr=3e-3, batch=16, seed=435, extra=_MEM),
        Spec("rl-finetune-mlp-sgd-regress-s436", task="regress", opt="sgd", lr=0.1,
             seed=436, extra={"noise": 0.02, "shift": 0.3, "pretrain": pre_adam}),
        Spec("rl-finetune-mlp-adamw-blobs-s437", opt="adamw", lr=3e-3, batch=16, seed=437,
             extra={"samples": 64, "shift": 1.0,
                    "pretrain": {"steps": 600, "lr": 1e-2, "opt": "adamw"}}),
    ]  # fmt: skip


def specs(tuning: bool = False) -> list[Spec]:
    """Every run of the set: each base unbroken (its control) and broken once per kind
    (``tuning``: of the tuning set)."""
    rng = np.random.default_rng(SEED + (TUNING_OFFSET if tuning else 0))
    out = []
    for base in bases(tuning):
        base = dataclasses.replace(base, steps=STEPS)
        out.append(dataclasses.replace(base, name=f"{base.name}-control"))
        for kind in FAILURES:
            at = int(rng.integers(BREAK[0], BREAK[1] + 1))
            low, high = RATES[kind]
            rate = round(float(rng.uniform(low, high)), 4)
            out.append(
                dataclasses.replace(
                    base, name=f"{base.name}-{kind}", failure=kind, onset=at, at=at, rate=rate
                )
            )
    return out


def is_control(spec: Spec) -> bool:
    """Whether ``spec`` is a base run left unbroken."""
    return spec.failure is None


def lrs_of(spec: Spec) -> list[float]:
    """The per-step lr the optimizer is given: the base's, then the failure's."""
    out = lr_list(dataclasses.replace(spec, failure=None))
    if spec.failure == "lr_jump":
        return [x * spec.rate if s >= spec.at else x for s, x in enumerate(out)]
    if spec.failure == "lr_ramp":
        return [x * spec.rate ** max(0, s - spec.at + 1) for s, x in enumerate(out)]
    return out


def _grad_scale(spec: Spec, s: int) -> float:
    if spec.failure == "grad_compound" and s >= spec.at:
        return spec.rate ** (s - spec.at + 1)
    return 1.0


def train(spec: Spec) -> dict[str, Any]:
    """Run ``spec`` for real, in graph mode (the caller's mode restored after); per step
    loss, grad_norm, lr, data/compute seconds (0: not timed) and ``opt``, the Adam-family
    moment norms, as ``bench/detect_runs.train`` returns them."""
    import mindspore as ms

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        return _train(spec)
    finally:
        ms.set_context(mode=mode)


def _train(spec: Spec) -> dict[str, Any]:
    import mindspore as ms
    from mindspore import ops

    from msmon_nb.collect.optstate import OptimizerState

    rng = np.random.default_rng(spec.seed)
    x, y, out_dim, (x_pre, y_pre) = build_data(spec, rng)
    n = x.shape[0]
    # the failure's own draws: the batches before and after ``at`` are the control's
    broken = np.random.default_rng(spec.seed + 1000)
    ms.set_seed(spec.seed)
    net = build_network(spec, out_dim)
    lrs = lrs_of(spec)
    params = net.trainable_params()
    opt = build_optimizer(spec, params, lrs)
    base = build_loss(spec)

    def forward(a, b):
        return base(net(a), b)

    def make_step(optimizer: Any) -> Any:
        grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

        @ms.jit
        def step(a, b, gscale):
            loss, grads = grad_fn(a, b)
            grads = tuple(g * gscale for g in grads)
            norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
            optimizer(grads)
            return loss, norm

        return step

    step = make_step(opt)
    first = next(p for p in params if p.name.endswith("weight") and len(p.shape) >= 2)

    @ms.jit
    def reinit(value):  # inside a graph: the compiled step holds the parameters
        ops.assign(first, value)
        return value

    adam_like = spec.opt in ("adam", "adamw", "adamw95")
    state = OptimizerState([".*"], lambda key, msg: None) if adam_like else None
    one = ms.Tensor(1.0, ms.float32)
    pre = spec.extra.get("pretrain")
    if pre:  # converged weights to fine-tune from: a first phase, unrecorded
        pre_step = make_step(build_optimizer(spec, params, [pre["lr"]] * pre["steps"], pre["opt"]))
        for _ in range(pre["steps"]):
            idx = rng.integers(0, n, size=spec.batch)
            pre_step(ms.Tensor(x_pre[idx]), ms.Tensor(y_pre[idx]), one)
    spread = float(x.std())
    direction = broken.normal(size=x.shape[1:]).astype(np.float32)
    direction /= float(np.sqrt((direction**2).mean()))  # unit spread per element
    rec: dict[str, Any] = {"loss": [], "grad_norm": [], "lr": [], "data": [], "compute": []}
    moments: dict[str, list[float]] = {}
    for s in range(spec.steps):
        idx = rng.integers(0, n, size=spec.batch)
        a, b = x[idx], y[idx]
        after = spec.failure is not None and s >= spec.at
        if after and spec.failure == "input_drift":
            a = (a + spec.rate * (s - spec.at + 1) * spread * direction).astype(np.float32)
        if after and spec.failure == "corrupt_shard" and s < spec.at + SHARD:
            a, b = a.copy(), b.copy()
            bad = broken.random(spec.batch) < spec.rate
            a[bad] = (broken.normal(size=a[bad].shape) * spread).astype(np.float32)
            if spec.task in ("regress", "linear"):
                b[bad] = (broken.normal(size=b[bad].shape) * float(y.std())).astype(np.float32)
            else:
                b[bad] = broken.integers(0, out_dim, size=int(bad.sum())).astype(b.dtype)
        if spec.failure == "reinit" and s == spec.at:
            w = first.asnumpy()
            fan_in = int(np.prod(w.shape[1:]))
            fresh = broken.normal(size=w.shape) / math.sqrt(fan_in)
            reinit(ms.Tensor(fresh.astype(np.float32)))
        g = _grad_scale(spec, s)
        gscale = one if g == 1.0 else ms.Tensor(g, ms.float32)
        loss, norm = step(ms.Tensor(a), ms.Tensor(b), gscale)
        rec["loss"].append(float(loss.asnumpy()))
        rec["grad_norm"].append(float(norm.asnumpy()))
        rec["lr"].append(lrs[s])
        rec["data"].append(0.0)
        rec["compute"].append(0.0)
        if state is not None:
            for tag, value in state.read(opt).items():
                moments.setdefault(tag, []).append(value)
    rec["opt"] = moments
    return rec
