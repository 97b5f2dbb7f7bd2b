"""The runs of the detection benchmark: what each trains, what goes wrong, and the training.

Three sets, all real CPU MindSpore training, with a failure scripted at a known step or
healthy:

* ``tuning_specs()``: the 67 runs the alert rules were designed on (tiny MLPs, SGD,
  Momentum, Adam, AdamWeightDecay), frozen as they were when issue 25 was filed, plus the
  ``adam_spike`` runs added with the ``adam_v_stale`` rule (which was tuned on them) and
  8 healthy runs that converge (issue 36: linear regression, memorising and separable
  MLPs, fine-tuning).
* ``test_specs()``: the held-out set, fixed before any further tuning: other models (a
  small conv net and a small transformer block, next to the MLP), other optimizers
  (Nesterov momentum, RMSProp, AdamWeightDecay with beta2 0.95), other schedules (warmup
  + linear decay, exponential decay), batch sizes 16 and 64, other seeds and failure
  rates. Nothing in ``msmon_nb.diagnose`` may be tuned on it.
* ``converged_specs()``: a held-out set of healthy runs that converge (issue 36), chosen
  before the rules learned about convergence, never tuned on.

``train(spec)`` returns per step: loss, grad_norm (global L2 norm of what the optimizer
received), lr, data and compute seconds, and for Adam-family optimizers the L2 norm of
each parameter's first and second moment as the monitor records them
(``msmon_nb.collect.optstate``: ``param/<name>/moment1_norm`` and ``moment2_norm``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FAILURES = (
    "explosion",
    "outlier",
    "vanishing",
    "nonfinite",
    "lr_zero",
    "lr_ramp",
    "slow_divergence",
    "plateau",
    "data_stall",
    "adam_spike",
)


@dataclass(frozen=True)
class Spec:
    """One run: how it trains and what goes wrong (``failure`` None = healthy)."""

    name: str
    failure: str | None = None
    onset: int | None = None  # first step whose recorded values show the failure
    # blobs (3 classes, cross-entropy) | regress (MSE) | sigmoid | linear (noiseless x @ w, MSE)
    task: str = "blobs"
    opt: str = "momentum"  # sgd | momentum | nesterov | adam | adamw | adamw95 | rmsprop
    lr: float = 0.05
    schedule: str = "constant"  # constant | warmup_cosine | step | warmup_linear | exp
    steps: int = 400
    batch: int = 32
    seed: int = 0
    at: int = 0  # the step the failure is injected at
    rate: float = 1.0  # growth per step (lr ramp, gradient-scale ramp), lr jump factor
    # sleep (data stall), q/back/ramp/beta2 (adam spike); converged runs: samples (a
    # set to memorise), sep (blob centres x sep: separable), pretrain ({steps, opt, lr}:
    # trained first, unrecorded), shift (fine-tuning targets from w + shift x another w),
    # noise (regress: the targets' noise, 0.1 unless given)
    extra: dict = field(default_factory=dict)
    model: str = "mlp"  # mlp | conv | transformer | linear

    def key(self) -> str:
        """A hash of the definition: cached curves belong to exactly this run."""
        data = asdict(self)
        if data["model"] == "mlp":  # the tuning set's keys, from before models existed
            del data["model"]
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def _slow_divergence(name: str, opt: str, lr: float, rate: float, seed: int, **kw: Any) -> Spec:
    """A regression run whose gradients grow by ``rate`` a step from step 150."""
    return Spec(
        name,
        "slow_divergence",
        150,
        task="regress",
        opt=opt,
        lr=lr,
        at=150,
        rate=rate,
        seed=seed,
        steps=kw.pop("steps", 450),
        **kw,
    )


def _adam_spike(name: str, seed: int, **kw: Any) -> Spec:
    """Adam whose gradients go quiet (x``q``) over ``[at, back)``, long enough for its
    second moment v to decay to the quiet level; at ``back`` normal gradients return and
    meet the decayed v: the update g/sqrt(v) is several times its usual size for tens of
    steps (arXiv 2506.04805). ``onset`` is ``back``, the first normal gradient."""
    extra = {"q": kw.pop("q", 0.01), "back": kw.pop("back", 450)}
    extra["beta2"] = kw.pop("beta2", 0.99)
    ramp = kw.pop("ramp", 0)
    if ramp:
        extra["ramp"] = ramp
    return Spec(
        name,
        "adam_spike",
        extra["back"],
        task=kw.pop("task", "regress"),
        opt=kw.pop("opt", "adam"),
        lr=kw.pop("lr", 0.05),
        at=kw.pop("at", 150),
        seed=seed,
        steps=kw.pop("steps", extra["back"] + 100),
        extra=extra,
        **kw,
    )


def frozen_tuning_specs() -> list[Spec]:
    """The 67 runs of bench/detect.py when issue 25 was filed (unchanged)."""
    out = [
        Spec("explosion-momentum", "explosion", 201, at=200, lr=0.05, rate=400.0),
        Spec("explosion-sgd", "explosion", 201, opt="sgd", lr=0.1, at=200, rate=200.0, seed=1),
        Spec("outlier-momentum", "outlier", 250, at=250, seed=2),
        Spec("outlier-adam", "outlier", 250, opt="adam", lr=1e-2, at=250, seed=3),
        Spec("outlier-sgd-b8", "outlier", 300, opt="sgd", lr=0.1, batch=8, at=300, seed=4),
        Spec("vanishing-momentum", "vanishing", 200, task="sigmoid", at=200, seed=0),
        Spec("vanishing-adam", "vanishing", 200, task="sigmoid", opt="adam", lr=1e-2, at=200),
        Spec("nan-momentum", "nonfinite", 220, at=220, seed=1),
        Spec("nan-adamw", "nonfinite", 180, opt="adamw", lr=5e-3, at=180, seed=2),
        Spec("lr-zero-momentum", "lr_zero", 200, at=200, seed=3),
        Spec("lr-zero-adam", "lr_zero", 150, opt="adam", lr=1e-2, at=150, seed=4),
        Spec("plateau-momentum", "plateau", 0, lr=1e-7, seed=5, steps=300),
        Spec("plateau-adam", "plateau", 0, opt="adam", lr=1e-8, seed=6, steps=300),
        Spec("data-stall-momentum", "data_stall", 150, at=150, steps=220, extra={"sleep": 0.02}),
        Spec(
            "data-stall-adam",
            "data_stall",
            120,
            opt="adam",
            lr=1e-2,
            at=120,
            steps=200,
            extra={"sleep": 0.02},
        ),
    ]
    for seed in range(3):
        for opt, lr in (("momentum", 0.02), ("adam", 5e-3)):
            out.append(
                Spec(
                    f"lr-ramp-{opt}-s{seed}",
                    "lr_ramp",
                    100,
                    task="regress",
                    opt=opt,
                    lr=lr,
                    at=100,
                    rate=1.06,
                    seed=seed,
                    steps=300,
                )
            )
    for seed, (opt, lr, rate) in enumerate(
        (
            ("momentum", 0.02, 1.03),
            ("sgd", 0.05, 1.03),
            ("momentum", 0.01, 1.02),
            ("sgd", 0.05, 1.04),
        )
    ):
        out.append(_slow_divergence(f"slow-div-{opt}-{rate}", opt, lr, rate, seed))
    extra = [
        ("sgd", 0.05, 1.05, 10),
        ("momentum", 0.02, 1.04, 11),
        ("sgd", 0.05, 1.025, 12),
        ("momentum", 0.01, 1.03, 13),
        ("sgd", 0.03, 1.03, 14),
        ("momentum", 0.02, 1.05, 15),
        ("sgd", 0.05, 1.045, 20),
        ("momentum", 0.02, 1.035, 21),
        ("sgd", 0.04, 1.05, 22),
        ("momentum", 0.015, 1.045, 23),
    ]
    for opt, lr, rate, seed in extra:
        out.append(_slow_divergence(f"slow-div-{opt}-{rate}-s{seed}", opt, lr, rate, seed))
    healthy = [
        ("sgd", 0.1, "constant", 32, "blobs"),
        ("sgd", 0.2, "step", 8, "blobs"),
        ("momentum", 0.05, "constant", 32, "blobs"),
        ("momentum", 0.1, "warmup_cosine", 128, "blobs"),
        ("momentum", 0.05, "step", 8, "blobs"),
        ("momentum", 0.02, "constant", 32, "regress"),
        ("momentum", 0.05, "warmup_cosine", 8, "regress"),
        ("adam", 1e-2, "constant", 32, "blobs"),
        ("adam", 3e-3, "warmup_cosine", 8, "blobs"),
        ("adam", 5e-3, "step", 128, "regress"),
        ("adam", 5e-3, "constant", 8, "regress"),
        ("adamw", 5e-3, "constant", 32, "blobs"),
        ("adamw", 1e-2, "warmup_cosine", 32, "blobs"),
        ("adamw", 5e-3, "step", 8, "regress"),
        ("sgd", 0.05, "warmup_cosine", 8, "regress"),
        ("momentum", 0.02, "step", 32, "regress"),
    ]
    for i, (opt, lr, sched, batch, task) in enumerate(healthy):
        for seed in (i, i + 20):
            out.append(
                Spec(
                    f"healthy-{opt}-{sched}-b{batch}-{task}-s{seed}",
                    task=task,
                    opt=opt,
                    lr=lr,
                    schedule=sched,
                    batch=batch,
                    seed=seed,
                    steps=600,
                )
            )
    return out


def _converged_tuning_specs() -> list[Spec]:
    """Healthy runs that converge (issue 36): the loss falls by orders of magnitude and
    the gradients shrink with it. MLP and linear models only, as the rest of the
    tuning set."""
    mem, ft = {"samples": 64}, {"steps": 600, "lr": 0.02, "opt": "momentum"}
    return [
        Spec("converged-linreg-sgd-s50", task="linear", model="linear", opt="sgd", lr=0.05,
             steps=400, seed=50),
        Spec("converged-linreg-adam-s51", task="linear", model="linear", opt="adam",
             lr=1e-2, steps=600, seed=51),
        Spec("converged-memorise-adam-regress-s52", task="regress", opt="adam", lr=1e-2,
             steps=1000, batch=16, seed=52, extra=mem),
        Spec("converged-memorise-momentum-blobs-s53", opt="momentum", lr=0.05, steps=1000,
             batch=16, seed=53, extra=mem),
        Spec("converged-separable-sgd-s54", opt="sgd", lr=0.1, steps=600, seed=54,
             extra={"sep": 4.0}),
        Spec("converged-separable-adam-s55", opt="adam", lr=1e-2, steps=600, seed=55,
             extra={"sep": 3.0}),
        Spec("converged-finetune-momentum-regress-s56", task="regress", opt="momentum",
             lr=0.005, steps=600, seed=56, extra={"shift": 0.5, "pretrain": ft}),
        Spec("converged-finetune-adamw-blobs-s57", opt="adamw", lr=1e-3, steps=600, seed=57,
             extra={"shift": 1.0, "pretrain": {"steps": 600, "lr": 5e-3, "opt": "adamw"}}),
    ]  # fmt: skip


def tuning_specs() -> list[Spec]:
    """The tuning set: the frozen 67 runs, the ``adam_spike`` runs of the
    ``adam_v_stale`` rule, and the converged runs of issue 36."""
    return [
        *frozen_tuning_specs(),
        _adam_spike("adam-spike-regress-s0", 0),
        _adam_spike("adam-spike-regress-lr1-s1", 1, lr=0.1),
        _adam_spike("adam-spike-blobs-s2", 2, task="blobs"),
        _adam_spike("adam-spike-blobs-q03-s3", 3, task="blobs", lr=0.1, q=0.03),
        # gradients coming back over 20-30 steps: grad_norm rises steadily, no jump
        _adam_spike("adam-spike-ramp-regress-s4", 4, ramp=20),
        _adam_spike("adam-spike-ramp-blobs-s5", 5, task="blobs", ramp=30),
        *_converged_tuning_specs(),
    ]


def test_specs() -> list[Spec]:
    """The held-out set (seeds 100+), chosen before any tuning on it."""
    out: list[Spec] = []
    models = ("conv", "transformer", "mlp")
    for i, model in enumerate(models):
        s = 100 + 10 * i
        tag = model
        out += [
            Spec(f"t-explosion-{tag}", "explosion", 181, model=model, at=180, lr=0.03,
                 opt="nesterov", rate=300.0, seed=s),
            Spec(f"t-explosion-adamw95-{tag}", "explosion", 241, model=model, at=240,
                 opt="adamw95", lr=3e-3, rate=100.0, seed=s + 1, batch=16),
            Spec(f"t-outlier-{tag}", "outlier", 230, model=model, at=230, opt="rmsprop",
                 lr=3e-3, seed=s + 2, batch=64),
            Spec(f"t-outlier-adamw95-{tag}", "outlier", 280, model=model, at=280,
                 opt="adamw95", lr=3e-3, seed=s + 3, batch=16),
            Spec(f"t-vanishing-{tag}", "vanishing", 160, model=model, task="sigmoid", at=160,
                 opt="nesterov", lr=0.03, seed=s + 4, batch=16),
            Spec(f"t-nan-{tag}", "nonfinite", 260, model=model, at=260, opt="rmsprop",
                 lr=3e-3, seed=s + 5, batch=64),
            Spec(f"t-lr-zero-{tag}", "lr_zero", 170, model=model, at=170, opt="adamw95",
                 lr=3e-3, schedule="warmup_linear", seed=s + 6, batch=16),
            Spec(f"t-plateau-{tag}", "plateau", 0, model=model, lr=3e-8, opt="rmsprop",
                 seed=s + 7, steps=300, batch=64),
            Spec(f"t-data-stall-{tag}", "data_stall", 140, model=model, at=140, steps=220,
                 opt="nesterov", lr=0.03, seed=s + 8, extra={"sleep": 0.015}, batch=64),
        ]  # fmt: skip
        for j, (opt, lr, rate) in enumerate(
            (("nesterov", 0.01, 1.05), ("adamw95", 2e-3, 1.08), ("rmsprop", 1e-3, 1.04))
        ):
            out.append(
                Spec(f"t-lr-ramp-{opt}-{tag}", "lr_ramp", 120, model=model, task="regress",
                     opt=opt, lr=lr, at=120, rate=rate, seed=s + 20 + j, steps=320, batch=16)
            )  # fmt: skip
        for j, (opt, lr, rate) in enumerate(
            (("sgd", 0.03, 1.035), ("nesterov", 0.01, 1.025), ("sgd", 0.02, 1.045),
             ("nesterov", 0.01, 1.05))
        ):  # fmt: skip
            out.append(
                _slow_divergence(f"t-slow-div-{opt}-{rate}-{tag}", opt, lr, rate, s + 30 + j,
                                 model=model, batch=64 if j % 2 else 16)
            )  # fmt: skip
        for j, (task, lr, q) in enumerate((("regress", 0.05, 0.01), ("blobs", 0.08, 0.02))):
            out.append(
                _adam_spike(f"t-adam-spike-{task}-{tag}", s + 40 + j, task=task, lr=lr, q=q,
                            model=model, batch=16, back=450 + 50 * j)
            )  # fmt: skip
        out.append(
            _adam_spike(f"t-adam-spike-ramp-{tag}", s + 42, lr=0.05, q=0.01, ramp=25,
                        model=model, batch=16, back=480)
        )  # fmt: skip
    healthy = [
        ("nesterov", 0.03, "warmup_linear", 16, "blobs"),
        ("nesterov", 0.01, "exp", 64, "regress"),
        ("rmsprop", 3e-3, "constant", 64, "blobs"),
        ("rmsprop", 1e-3, "warmup_cosine", 16, "regress"),
        ("adamw95", 3e-3, "warmup_linear", 16, "blobs"),
        ("adamw95", 2e-3, "exp", 64, "regress"),
        ("adam", 3e-3, "constant", 16, "regress"),
        ("sgd", 0.05, "exp", 16, "blobs"),
    ]
    for model in models:
        for i, (opt, lr, sched, batch, task) in enumerate(healthy):
            seed = 200 + 10 * models.index(model) + i
            out.append(
                Spec(f"t-healthy-{opt}-{sched}-b{batch}-{task}-{model}-s{seed}", task=task,
                     opt=opt, lr=lr, schedule=sched, batch=batch, seed=seed, steps=500,
                     model=model)
            )  # fmt: skip
    return out


def converged_specs() -> list[Spec]:
    """The held-out converged set (issue 36; seeds 300+), healthy runs only, chosen and
    frozen before the rules learned about convergence: noiseless linear regression to
    machine precision, an MLP, a conv net and a transformer block memorising 64 samples,
    classification of separable blobs to ~0 loss, fine-tuning trained weights on a
    related task at a small lr. Nothing in ``msmon_nb.diagnose`` may be tuned on it."""
    mem = {"samples": 64}
    return [
        Spec("cv-linreg-sgd-s300", task="linear", model="linear", opt="sgd", lr=0.1,
             steps=400, seed=300),
        Spec("cv-linreg-momentum-b64-s301", task="linear", model="linear", opt="momentum",
             lr=0.02, steps=500, batch=64, seed=301),
        Spec("cv-linreg-adam-b16-s302", task="linear", model="linear", opt="adam", lr=3e-3,
             steps=800, batch=16, seed=302),
        Spec("cv-memorise-mlp-adam-regress-s303", task="regress", opt="adam", lr=1e-2,
             steps=1000, batch=16, seed=303, extra=mem),
        Spec("cv-memorise-mlp-rmsprop-blobs-s304", opt="rmsprop", lr=3e-3, steps=1000,
             batch=16, seed=304, extra=mem),
        Spec("cv-memorise-conv-adam-regress-s305", task="regress", model="conv", opt="adam",
             lr=3e-3, steps=1000, batch=16, seed=305, extra=mem),
        Spec("cv-memorise-conv-nesterov-blobs-s306", model="conv", opt="nesterov", lr=0.03,
             steps=1000, batch=16, seed=306, extra=mem),
        Spec("cv-memorise-transformer-adam-blobs-s307", model="transformer", opt="adam",
             lr=3e-3, steps=1000, batch=16, seed=307, extra=mem),
        Spec("cv-separable-mlp-nesterov-s308", opt="nesterov", lr=0.03, steps=600, seed=308,
             extra={"sep": 4.0}),
        Spec("cv-separable-transformer-adamw95-s309", model="transformer", opt="adamw95",
             lr=3e-3, steps=600, seed=309, extra={"sep": 3.0}),
        Spec("cv-finetune-mlp-sgd-regress-s310", task="regress", opt="sgd", lr=0.01,
             steps=600, seed=310,
             extra={"shift": 0.3, "pretrain": {"steps": 600, "lr": 1e-2, "opt": "adam"}}),
        Spec("cv-finetune-conv-momentum-blobs-s311", model="conv", opt="momentum", lr=3e-3,
             steps=600, seed=311,
             extra={"shift": 1.0, "pretrain": {"steps": 400, "lr": 3e-3, "opt": "adam"}}),
    ]  # fmt: skip


def is_converged(spec: Spec) -> bool:
    """Whether ``spec`` is one of the converged healthy runs of issue 36."""
    return spec.name.startswith(("converged-", "cv-"))


def lr_list(spec: Spec) -> list[float]:
    """The per-step learning rate the optimizer is given (schedule, then the failure)."""
    n, lr = spec.steps, spec.lr
    if spec.schedule in ("warmup_cosine", "warmup_linear"):
        warm = n // 10
        if spec.schedule == "warmup_cosine":
            tail = [0.5 * lr * (1 + math.cos(math.pi * (s - warm) / (n - warm))) for s in range(n)]
        else:
            tail = [lr * (1.0 - 0.9 * (s - warm) / (n - warm)) for s in range(n)]
        out = [lr * (s + 1) / warm if s < warm else tail[s] for s in range(n)]
    elif spec.schedule == "step":
        out = [lr * 0.1 ** (s // (n // 3)) for s in range(n)]
    elif spec.schedule == "exp":
        out = [lr * 0.996**s for s in range(n)]
    else:
        out = [lr] * n
    if spec.failure == "explosion":
        out = out[: spec.at] + [x * spec.rate for x in out[spec.at :]]
    elif spec.failure == "lr_zero":
        out = out[: spec.at] + [0.0] * (n - spec.at)
    elif spec.failure == "lr_ramp":
        out = [x * spec.rate ** max(0, s - spec.at + 1) for s, x in enumerate(out)]
    return out


def build_data(spec: Spec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, tuple]:
    """Synthetic inputs, targets, output width, and the (inputs, targets) of the
    pretraining phase (the same unless ``shift``); the MLP's draws are those of the
    frozen tuning set. Public: ``bench/blame_detect.py`` re-runs the held-out runs with
    the same data, network and optimizer (``rng`` seeded as ``train`` seeds it)."""
    n = spec.extra.get("samples", 2048)
    shift = spec.extra.get("shift")
    features = {"mlp": 8, "linear": 8, "conv": 64, "transformer": 32}[spec.model]
    x = x_pre = rng.normal(size=(n, features)).astype(np.float32)
    if spec.task in ("regress", "linear"):
        w = rng.normal(size=(features, 1)).astype(np.float32) / math.sqrt(features / 8)

        def targets(w: np.ndarray) -> np.ndarray:
            if spec.task == "linear":
                return (x @ w).astype(np.float32)
            noise = spec.extra.get("noise", 0.1)  # the regression's floor: noise^2
            return (np.tanh(x @ w) + noise * rng.normal(size=(n, 1))).astype(np.float32)

        y = y_pre = targets(w)
        if shift is not None:  # a related task: the weights moved by shift x another draw
            y = targets(w + shift * rng.normal(size=w.shape).astype(np.float32) * w.std())
        out_dim = 1
    else:
        centres = rng.normal(size=(3, features)).astype(np.float32)
        if spec.model != "mlp":
            centres *= math.sqrt(8 / features) * 1.5
        centres *= spec.extra.get("sep", 1.0)
        y = y_pre = rng.integers(0, 3, size=n).astype(np.int32)
        x = x_pre = (centres[y] + rng.normal(size=(n, features))).astype(np.float32)
        if shift is not None:  # a related task: every centre moved by shift x its size
            moved = (
                centres + shift * rng.normal(size=centres.shape).astype(np.float32) * centres.std()
            )
            x = (moved[y] + rng.normal(size=(n, features))).astype(np.float32)
        out_dim = 3
    if spec.model == "conv":
        x, x_pre = x.reshape(n, 1, 8, 8), x_pre.reshape(n, 1, 8, 8)
    elif spec.model == "transformer":
        x, x_pre = x.reshape(n, 4, 8), x_pre.reshape(n, 4, 8)
    return x, y, out_dim, (x_pre, y_pre)


def build_network(spec: Spec, out_dim: int) -> Any:
    """The spec's model (mlp, linear, conv, transformer) with ``out_dim`` outputs; the
    caller seeds MindSpore first (``train`` does with ``spec.seed``)."""
    from mindspore import nn, ops

    act = nn.Sigmoid() if spec.task == "sigmoid" and spec.model == "mlp" else nn.ReLU()
    if spec.model == "mlp":
        return nn.SequentialCell([nn.Dense(8, 32), act, nn.Dense(32, out_dim)])
    if spec.model == "linear":
        return nn.Dense(8, out_dim)
    if spec.model == "conv":
        return nn.SequentialCell(
            [
                nn.Conv2d(1, 4, 3, stride=2, pad_mode="same", has_bias=True),
                nn.ReLU(),
                nn.Conv2d(4, 8, 3, stride=2, pad_mode="same", has_bias=True),
                nn.ReLU(),
                nn.Flatten(),
                nn.Dense(32, out_dim),
            ]
        )

    class Block(nn.Cell):
        """One pre-norm transformer block (single-head attention, MLP) over 4 tokens;
        the head reads every token (a mean would lose which token is which)."""

        def __init__(self) -> None:
            super().__init__()
            d = 8
            self.norm1 = nn.LayerNorm((d,))
            self.qkv = nn.Dense(d, 3 * d)
            self.proj = nn.Dense(d, d)
            self.norm2 = nn.LayerNorm((d,))
            self.mlp = nn.SequentialCell([nn.Dense(d, 16), nn.GELU(), nn.Dense(16, d)])
            self.head = nn.Dense(4 * d, out_dim)
            self.scale = 1.0 / math.sqrt(d)

        def construct(self, x):
            h = self.norm1(x)
            q, k, v = ops.split(self.qkv(h), 8, axis=-1)
            att = ops.softmax(ops.bmm(q, k.transpose(0, 2, 1)) * self.scale, axis=-1)
            x = x + self.proj(ops.bmm(att, v))
            x = x + self.mlp(self.norm2(x))
            return self.head(x.reshape(x.shape[0], -1))

    return Block()


def build_optimizer(spec: Spec, params: list, lrs: list[float], name: str | None = None) -> Any:
    """The spec's optimizer (or ``name``) over ``params`` (parameters, or group dicts
    whose own ``lr`` overrides ``lrs``) at the per-step learning rates ``lrs``."""
    from mindspore import nn

    beta2 = spec.extra.get("beta2")
    name = name or spec.opt
    if name == "sgd":
        return nn.SGD(params, learning_rate=lrs)
    if name == "momentum":
        return nn.Momentum(params, learning_rate=lrs, momentum=0.9)
    if name == "nesterov":
        return nn.Momentum(params, learning_rate=lrs, momentum=0.9, use_nesterov=True)
    if name == "adam":
        kw = {} if beta2 is None else {"beta2": beta2}
        return nn.Adam(params, learning_rate=lrs, **kw)
    if name == "adamw":
        return nn.AdamWeightDecay(params, learning_rate=lrs, weight_decay=0.01)
    if name == "adamw95":
        return nn.AdamWeightDecay(params, learning_rate=lrs, beta2=0.95, weight_decay=0.01)
    if name == "rmsprop":
        return nn.RMSProp(params, learning_rate=lrs, decay=0.9)
    raise ValueError(f"unknown optimizer {name!r}")


def build_loss(spec: Spec) -> Any:
    """The spec's loss of (logits, labels): MSE (regress, linear), squared error on
    sigmoids (sigmoid: saturates when the weights blow up), else cross-entropy."""
    import mindspore as ms
    from mindspore import nn, ops

    if spec.task in ("regress", "linear"):
        return nn.MSELoss()
    if spec.task == "sigmoid":

        def base(logits, labels):
            target = ops.one_hot(labels, 3, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
            return ((ops.sigmoid(logits) - target) ** 2).mean()

        return base
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def grad_scale(spec: Spec, s: int) -> float:
    """What the step's gradients are multiplied by before the optimizer sees them."""
    if spec.failure == "slow_divergence" and s >= spec.at:
        return spec.rate ** (s - spec.at + 1)
    if spec.failure == "adam_spike" and s >= spec.at:
        back, q, ramp = spec.extra["back"], spec.extra["q"], spec.extra.get("ramp", 0)
        if s < back:
            return q
        if s < back + ramp:
            return q ** (1.0 - (s - back + 1) / ramp)
    return 1.0


def train(spec: Spec) -> dict[str, Any]:
    """Run ``spec`` for real; per step: loss, grad_norm, lr, data and compute seconds, and
    ``opt``: ``{tag: [value per step]}`` of the Adam-family moment norms. In graph mode;
    the caller's execution mode is restored after (tests run it beside PyNative tests)."""
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
    ms.set_seed(spec.seed)
    net = build_network(spec, out_dim)
    lrs = lr_list(spec)
    params = net.trainable_params()
    opt = build_optimizer(spec, params, lrs)
    base = build_loss(spec)

    def forward(a, b, factor):
        return base(net(a), b) * factor

    def make_step(optimizer: Any) -> Any:
        grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

        @ms.jit
        def step(a, b, factor, gscale):
            loss, grads = grad_fn(a, b, factor)
            grads = tuple(g * gscale for g in grads)
            norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
            optimizer(grads)
            return loss, norm

        return step

    step = make_step(opt)

    # a bad re-initialisation: the whole MLP (its sigmoids saturate), the output layer of
    # the other models (the sigmoid loss saturates)
    scaled = params if spec.model == "mlp" else params[-2:]

    @ms.jit
    def scale_params(factor):  # inside the graph: the compiled step holds the parameters
        for p in scaled:
            ops.assign(p, p * factor)
        return factor

    adam_like = spec.opt in ("adam", "adamw", "adamw95")
    state = OptimizerState([".*"], lambda key, msg: None) if adam_like else None
    one = ms.Tensor(1.0, ms.float32)
    pre = spec.extra.get("pretrain")
    if pre:  # trained weights to fine-tune: a first phase of its own optimizer, unrecorded
        pre_step = make_step(build_optimizer(spec, params, [pre["lr"]] * pre["steps"], pre["opt"]))
        for _ in range(pre["steps"]):
            idx = rng.integers(0, n, size=spec.batch)
            pre_step(ms.Tensor(x_pre[idx]), ms.Tensor(y_pre[idx]), one, one)
    rec: dict[str, Any] = {"loss": [], "grad_norm": [], "lr": [], "data": [], "compute": []}
    moments: dict[str, list[float]] = {}
    sleep = spec.extra.get("sleep", 0.0)
    for s in range(spec.steps):
        t0 = time.perf_counter()
        idx = rng.integers(0, n, size=spec.batch)
        a, b = x[idx], y[idx]
        if spec.failure == "outlier" and s == spec.at:
            b = (b + 1) % 3 if spec.task != "regress" else -b  # every label wrong
            a = a * 3.0
        if spec.failure == "data_stall" and s >= spec.at:
            time.sleep(sleep)
        a, b = ms.Tensor(a), ms.Tensor(b)
        factor = one
        if spec.failure == "nonfinite" and s >= spec.at:
            factor = ms.Tensor(float("nan"), ms.float32)
        g = grad_scale(spec, s)
        gscale = one if g == 1.0 else ms.Tensor(g, ms.float32)
        if spec.failure == "vanishing" and s == spec.at:
            scale_params(ms.Tensor(1000.0, ms.float32))
        t1 = time.perf_counter()
        loss, norm = step(a, b, factor, gscale)
        loss = float(loss.asnumpy())
        t2 = time.perf_counter()
        rec["loss"].append(loss)
        rec["grad_norm"].append(float(norm.asnumpy()))
        rec["lr"].append(lrs[s])
        rec["data"].append(t1 - t0)
        rec["compute"].append(t2 - t1)
        if state is not None:
            for tag, value in state.read(opt).items():
                moments.setdefault(tag, []).append(value)
    rec["opt"] = moments
    return rec
