"""The attention set's runs: tiny transformers on a toy sequence task, CPU, seconds each.

A run is two post-LN ``nn.TransformerEncoderLayer`` s (width 32, 4 heads, no QK
layernorm) over sequences of 8 tokens; the class to predict is the token at the position
the first token names (a lookup: the model has to attend). Adam, lr ``BASE_LR``.

- ``qk_lr`` (fails): from step ``at`` the query/key projections' lr grows by ``mult``
  every ``RAMP`` steps (the rest unchanged) -- the instability Wortsman et al. 2023 show at small
  scale: the QK weights grow, the attention logits grow with their product, the softmax
  saturates to one-hot rows, and the loss diverges later.
- ``lr_all`` (fails): from step ``at`` the whole model's lr grows the same way:
  the logits grow together with everything else, the classic way a run blows up.
- ``control`` (healthy): the base lr throughout (``mult`` draws its lr within 0.5-2x);
  ``warm`` (healthy): a 10x larger lr with warmup and no QK bump, which trains fast and
  sharpens its attention by design (the logits rise while the loss falls).

Every step records the loss, the global gradient norm, the lr, and each attention
module's ``max_logit`` and ``entropy`` as the monitor computes them
(``msmon_nb.collect.attention``: the same ``Snapshot`` / ``signals``, from a forward
hook of the run's own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SEED = 4545  # the held-out set's draws
TUNE_SEED = 7171  # the tuning set's
STEPS = 170
WIDTH, HEADS, SEQ, VOCAB = 32, 4, 8, 8
BASE_LR = 1e-3
RAMP = 50  # a failing run's lr grows by ``mult`` every RAMP steps from ``at``
FAILURES = ("qk_lr", "lr_all")
HEALTHY = ("control", "warm")


@dataclass(frozen=True)
class Spec:
    """One run: its kind, seed, the step its lr changes (``at``) and by how much."""

    kind: str
    seed: int
    at: int
    mult: float
    steps: int = STEPS

    @property
    def name(self) -> str:
        return f"{self.kind}-s{self.seed}-at{self.at}-x{self.mult:g}"

    @property
    def fails(self) -> bool:
        return self.kind in FAILURES


def specs(seed: int = SEED, per_kind: int = 2) -> list[Spec]:
    """The set's runs: ``per_kind`` of each failure and each healthy kind, drawn."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in (*FAILURES, *HEALTHY):
        for _ in range(per_kind):
            run_seed = int(rng.integers(1, 10_000))
            if kind == "qk_lr":
                out.append(Spec(kind, run_seed, int(rng.integers(40, 70)), _log(rng, 10, 30)))
            elif kind == "lr_all":
                out.append(Spec(kind, run_seed, int(rng.integers(40, 70)), _log(rng, 5, 15)))
            elif kind == "control":
                out.append(Spec(kind, run_seed, 0, _log(rng, 0.5, 2.0)))
            else:
                out.append(Spec(kind, run_seed, 0, _log(rng, 5, 10)))
    return out


def tuning_specs() -> list[Spec]:
    """A separate set, other draws, for tuning the rule (never the held-out one)."""
    return specs(TUNE_SEED, per_kind=1)


def _log(rng: np.random.Generator, low: float, high: float) -> float:
    return float(round(math.exp(rng.uniform(math.log(low), math.log(high))), 2))


def lrs(spec: Spec, step: int) -> tuple[float, float]:
    """(the QK projections' lr, everything else's) at ``step``."""
    ramp = spec.mult ** (max(0, step - spec.at) / RAMP)
    if spec.kind == "qk_lr":
        return BASE_LR * ramp, BASE_LR
    if spec.kind == "lr_all":
        return BASE_LR * ramp, BASE_LR * ramp
    if spec.kind == "control":
        return BASE_LR * spec.mult, BASE_LR * spec.mult
    lr = BASE_LR * spec.mult * min(1.0, (step + 1) / 50)  # warm: warmup over 50 steps
    return lr, lr


def batch(rng: np.random.Generator, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences (one-hot) and their labels: the token at the position the first
    token names."""
    tokens = rng.integers(0, VOCAB, size=(size, SEQ))
    labels = tokens[np.arange(size), tokens[:, 0] % SEQ]
    return np.eye(VOCAB, dtype=np.float32)[tokens], labels.astype(np.int32)


def train(spec: Spec) -> dict[str, Any]:
    """Train one run on the CPU (a compiled step); its per-step curves.

    The attention signals are those the monitor computes (``Snapshot`` / ``signals``)
    from each attention module's input, which a compiled probe of the bench's own gives
    before the step (the same weights and batch, no dropout: the inputs the step's
    forward pass feeds them). PyNative hooks would do the same at ~50x the time on this
    2-core machine."""
    import mindspore as ms
    from mindspore import nn, ops

    from msmon_nb.collect.attention import Snapshot, signals
    from msmon_nb.collect.graph import write_scalar

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(spec.seed)

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Dense(VOCAB + SEQ, WIDTH)
            layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 64, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2)
            self.head = nn.Dense(WIDTH, VOCAB)
            self.pos = ms.Tensor(np.eye(SEQ, dtype=np.float32)[None])

        def inputs(self, x):
            pos = ops.broadcast_to(self.pos, (x.shape[0], SEQ, SEQ))
            return self.embed(ops.concat((x, pos), -1))

        def construct(self, x):
            return self.head(self.encoder(self.inputs(x))[:, 0])

    net = Net()
    params = net.trainable_params()
    qk = [p for p in params if "in_proj" in p.name]
    rest = [p for p in params if "in_proj" not in p.name]
    opt_qk = nn.Adam(qk, learning_rate=ms.Tensor(BASE_LR, ms.float32))
    opt_rest = nn.Adam(rest, learning_rate=ms.Tensor(BASE_LR, ms.float32))
    # the optimizers hold their lr as a Parameter of their own, written in place before
    # each step (``set_data`` swaps the buffer, which the compiled step never sees)
    lr_qk, lr_rest = opt_qk.learning_rate, opt_rest.learning_rate
    for own in ("global_step", "beta1_power", "beta2_power", "learning_rate"):  # one graph
        getattr(opt_rest, own).name = f"{own}_rest"  # holds two optimizers
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward(a, b):
        return loss_fn(net(a), b)

    grad_fn = ms.value_and_grad(forward, None, opt_qk.parameters + opt_rest.parameters)
    n_qk = len(qk)

    @ms.jit
    def step(a, b):
        loss, grads = grad_fn(a, b)
        opt_qk(grads[:n_qk])
        opt_rest(grads[n_qk:])
        return loss, ops.sqrt(sum(ops.reduce_sum(g * g) for g in grads))

    layers = list(net.encoder.layers)

    @ms.jit
    def probe(a):
        h0 = net.inputs(a)
        return h0, layers[0](h0)

    modules = [f"encoder.layers.{i}.self_attn" for i in range(len(layers))]
    rng = np.random.default_rng(spec.seed)
    rec: dict[str, Any] = {"loss": [], "grad_norm": [], "lr": [], "modules": modules}
    rec["max_logit"] = [[] for _ in modules]
    rec["entropy"] = [[] for _ in modules]
    for i in range(spec.steps):
        a, b = batch(rng)
        q_lr, r_lr = lrs(spec, i)
        write_scalar(lr_qk, q_lr)
        write_scalar(lr_rest, r_lr)
        x = ms.Tensor(a)
        for j, h in enumerate(probe(x)):
            got = signals(Snapshot(layers[j].self_attn, (h, h, h), {}))
            rec["max_logit"][j].append(got["max_logit"])
            rec["entropy"][j].append(got["entropy"])
        loss, norm = step(x, ms.Tensor(b))
        rec["loss"].append(float(loss.asnumpy()))
        rec["grad_norm"].append(float(norm.asnumpy()))
        rec["lr"].append(r_lr)
    return rec
