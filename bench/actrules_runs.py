"""The activation-rules set's runs: tiny networks on a toy task, CPU, seconds each.

Two networks, both trained with Adam on minibatches of 16:

- a transformer (one embedding ``embed``, two post-LN blocks ``blocks.<i>`` of
  single-head attention ``attn_out`` and a ReLU feed-forward ``ff1``/``ff2``, each with
  ``norm1``/``norm2``, and an output layer ``head``) on the attention set's lookup task
  (``bench/attn_runs.py``: the class is the token at the position the first token names);
- an MLP of four ``nn.Dense(..., activation="relu")`` layers ``fc1``-``fc4`` and an output
  layer ``out`` on a 16-feature, 4-class problem (the class is the argmax of 4 fixed
  random projections).

Failures (``module``: the module the fault is in, the one a rule should name):

- ``head_lr`` (transformer): from step ``at`` the output layer's lr grows by ``mult``
  every ``RAMP`` steps (the rest unchanged): its weights and the logits grow until the
  loss diverges (Wortsman et al. 2023's output logit divergence; z-loss is the usual fix).
- ``ff_lr`` (transformer): from step ``at`` one block's first feed-forward layer
  (``blocks.0.ff1``) gets the same ramp: its activations blow up while the modules before
  it do not.
- ``dying`` (MLP): at step ``at`` one hidden layer's biases (``fc2.bias``) are written
  ``mult`` lower (a bad update that pushed every unit's bias negative): its ReLU units
  die. An lr spike did not do it on this MLP (one Adam step at x3000-x10000 the lr on
  ``fc2`` lowered its zero fraction from 0.53 to 0.19; plain SGD at x30-x300 left it
  unchanged: its gradients are small), so the bad update is written directly, as the
  ``nan`` fault writes its NaN.
- ``nan`` (transformer): at step ``at`` one weight of a middle module (``blocks.1.ff1``)
  is overwritten with NaN (a corrupted write): from then its output, and everything
  after it, is not finite.

Healthy runs: ``control`` (transformer, base lr x0.5-2), ``mlp`` (the MLP, base lr
x0.5-2).

Every step records the loss, the global gradient norm, the lr, and each module's forward
output statistics as ``collect.activations`` computes them (``metrics.extent.tensor_extent``
over ``ACT_STATS``): the step's own forward pass returns the outputs (``has_aux``), so
the statistics are of exactly the activations the update used. The modules are listed
in forward order (the order the monitor first records them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SEED = 4646  # the held-out set's draws
TUNE_SEED = 8282  # the tuning set's
STEPS = 150
WIDTH, SEQ, VOCAB = 32, 8, 8
FEATURES, CLASSES, HIDDEN = 16, 4, 32
BASE_LR = 1e-3
RAMP = 30  # a ramped lr grows by ``mult`` every RAMP steps from ``at``
FAILURES = ("head_lr", "ff_lr", "dying", "nan")
HEALTHY = ("control", "mlp")
# failure kind -> the module its fault is in
CULPRIT = {
    "head_lr": "head",
    "ff_lr": "blocks.0.ff1",
    "dying": "fc2",
    "nan": "blocks.1.ff1",
}
MLP_KINDS = ("dying", "mlp")
TRANSFORMER_MODULES = [
    "embed",
    *[f"blocks.{i}.{m}" for i in range(2) for m in ("attn_out", "norm1", "ff1", "ff2", "norm2")],
    "head",
]
MLP_MODULES = ["fc1", "fc2", "fc3", "fc4", "out"]


@dataclass(frozen=True)
class Spec:
    """One run: its kind, seed, the step its fault begins (``at``) and its size."""

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

    @property
    def culprit(self) -> str | None:
        return CULPRIT.get(self.kind)


def specs(seed: int = SEED, per_kind: int = 2) -> list[Spec]:
    """The set's runs: ``per_kind`` of each failure and each healthy kind, drawn."""
    rng = np.random.default_rng(seed)
    out = []
    for kind in (*FAILURES, *HEALTHY):
        for _ in range(per_kind):
            run_seed = int(rng.integers(1, 10_000))
            at = int(rng.integers(50, 80))
            if kind in ("head_lr", "ff_lr"):
                out.append(Spec(kind, run_seed, at, _log(rng, 40, 100)))
            elif kind == "dying":
                out.append(Spec(kind, run_seed, at, _log(rng, 2, 6)))
            elif kind == "nan":
                out.append(Spec(kind, run_seed, at, 1.0))
            else:
                out.append(Spec(kind, run_seed, 0, _log(rng, 0.5, 2.0)))
    return out


def tuning_specs() -> list[Spec]:
    """A separate set, other draws, for tuning the rules (never the held-out one)."""
    return specs(TUNE_SEED, per_kind=1)


def _log(rng: np.random.Generator, low: float, high: float) -> float:
    return float(round(math.exp(rng.uniform(math.log(low), math.log(high))), 2))


def lrs(spec: Spec, step: int) -> tuple[float, float]:
    """(the faulty group's lr, everything else's) at ``step``."""
    if spec.kind in HEALTHY:
        return BASE_LR * spec.mult, BASE_LR * spec.mult
    if spec.kind in ("head_lr", "ff_lr"):
        return BASE_LR * spec.mult ** (max(0, step - spec.at) / RAMP), BASE_LR
    return BASE_LR, BASE_LR


def lookup_batch(rng: np.random.Generator, size: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Token sequences (one-hot, positions appended) and their labels."""
    tokens = rng.integers(0, VOCAB, size=(size, SEQ))
    labels = tokens[np.arange(size), tokens[:, 0] % SEQ]
    onehot = np.eye(VOCAB, dtype=np.float32)[tokens]
    pos = np.broadcast_to(np.eye(SEQ, dtype=np.float32)[None], (size, SEQ, SEQ))
    return np.concatenate([onehot, pos], -1), labels.astype(np.int32)


def mlp_batch(
    rng: np.random.Generator, proj: np.ndarray, size: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(size, FEATURES)).astype(np.float32)
    return x, np.argmax(x @ proj, axis=1).astype(np.int32)


def _transformer() -> tuple[Any, list[str], str]:
    """The transformer: a Cell whose construct returns (logits, each module's output)."""
    import mindspore as ms
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Dense(WIDTH, WIDTH)
            self.k = nn.Dense(WIDTH, WIDTH)
            self.v = nn.Dense(WIDTH, WIDTH)
            self.attn_out = nn.Dense(WIDTH, WIDTH)
            self.norm1 = nn.LayerNorm((WIDTH,))
            self.ff1 = nn.Dense(WIDTH, 2 * WIDTH)
            self.ff2 = nn.Dense(2 * WIDTH, WIDTH)
            self.norm2 = nn.LayerNorm((WIDTH,))
            self.scale = 1.0 / math.sqrt(WIDTH)

        def construct(self, h):
            q, k, v = self.q(h), self.k(h), self.v(h)
            w = ops.softmax(ops.bmm(q, k.transpose(0, 2, 1)) * self.scale, -1)
            a = self.attn_out(ops.bmm(w, v))
            h1 = self.norm1(h + a)
            f1 = self.ff1(h1)
            f2 = self.ff2(ops.relu(f1))
            h2 = self.norm2(h1 + f2)
            return h2, (a, h1, f1, f2, h2)

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Dense(VOCAB + SEQ, WIDTH)
            self.blocks = nn.CellList([Block(), Block()])
            self.head = nn.Dense(WIDTH, VOCAB)

        def construct(self, x):
            h = self.embed(x)
            outs = (h,)
            for block in self.blocks:
                h, got = block(h)
                outs = outs + got
            logits = self.head(h[:, 0])
            return logits, outs + (logits,)  # noqa: RUF005 (graph syntax)

    del ms
    return Net(), TRANSFORMER_MODULES, "head"


def _mlp() -> tuple[Any, list[str], str]:
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Dense(FEATURES, HIDDEN, activation="relu")
            self.fc2 = nn.Dense(HIDDEN, HIDDEN, activation="relu")
            self.fc3 = nn.Dense(HIDDEN, HIDDEN, activation="relu")
            self.fc4 = nn.Dense(HIDDEN, HIDDEN, activation="relu")
            self.out = nn.Dense(HIDDEN, CLASSES)

        def construct(self, x):
            h1 = self.fc1(x)
            h2 = self.fc2(h1)
            h3 = self.fc3(h2)
            h4 = self.fc4(h3)
            logits = self.out(h4)
            return logits, (h1, h2, h3, h4, logits)

    return Net(), MLP_MODULES, "out"


def train(spec: Spec) -> dict[str, Any]:
    """Train one run on the CPU (a compiled step); its per-step curves."""
    import mindspore as ms
    from mindspore import nn, ops

    from msmon_nb.collect.graph import write_scalar
    from msmon_nb.metrics.extent import ACT_STATS, tensor_extent

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(spec.seed)
    mlp = spec.kind in MLP_KINDS
    net, modules, _ = _mlp() if mlp else _transformer()
    culprit = spec.culprit
    group = culprit if spec.kind in ("head_lr", "ff_lr") else None
    params = net.trainable_params()
    faulty = [p for p in params if group is not None and p.name.startswith(group + ".")]
    rest = [p for p in params if not any(p is f for f in faulty)]
    if not faulty:  # one optimizer of two still steps: an empty group is not allowed
        faulty, rest = rest[:1], rest[1:]
    opt_a = nn.Adam(faulty, learning_rate=ms.Tensor(BASE_LR, ms.float32))
    opt_b = nn.Adam(rest, learning_rate=ms.Tensor(BASE_LR, ms.float32))
    lr_a, lr_b = opt_a.learning_rate, opt_b.learning_rate
    for own in ("global_step", "beta1_power", "beta2_power", "learning_rate"):
        getattr(opt_b, own).name = f"{own}_rest"
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward(a, b):
        logits, outs = net(a)
        return loss_fn(logits, b), outs

    grad_fn = ms.value_and_grad(forward, None, opt_a.parameters + opt_b.parameters, has_aux=True)
    n_a = len(faulty)

    @ms.jit
    def step(a, b):
        (loss, outs), grads = grad_fn(a, b)
        opt_a(grads[:n_a])
        opt_b(grads[n_a:])
        return loss, ops.sqrt(sum(ops.reduce_sum(g * g) for g in grads)), outs

    rng = np.random.default_rng(spec.seed)
    proj = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    rec: dict[str, Any] = {"loss": [], "grad_norm": [], "lr": [], "modules": modules}
    rec["act"] = {stat: [[] for _ in modules] for stat in ACT_STATS}
    by_name = {p.name: p for p in params}
    for i in range(spec.steps):
        a, b = mlp_batch(rng, proj) if mlp else lookup_batch(rng)
        if spec.kind in ("nan", "dying") and i == spec.at:
            # in place (ops.assign): the compiled step reads the same buffer
            if spec.kind == "nan":
                weight = by_name[f"{culprit}.weight"]
                w = weight.asnumpy().copy()
                w[0, 0] = np.nan
            else:
                weight = by_name[f"{culprit}.bias"]
                w = weight.asnumpy() - np.float32(spec.mult)
            ops.assign(weight, ms.Tensor(w))
        fa, fb = lrs(spec, i)
        write_scalar(lr_a, fa)
        write_scalar(lr_b, fb)
        loss, norm, outs = step(ms.Tensor(a), ms.Tensor(b))
        for j, out in enumerate(outs):
            got = tensor_extent(out.asnumpy(), ACT_STATS)
            for stat in ACT_STATS:
                rec["act"][stat][j].append(got[stat])
        rec["loss"].append(float(loss.asnumpy()))
        rec["grad_norm"].append(float(norm.asnumpy()))
        rec["lr"].append(fb)
    return rec
