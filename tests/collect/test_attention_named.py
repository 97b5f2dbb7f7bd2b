"""``attention_targets``: attention modules the user names, recomputed by structure
(``collect.attnform``), in PyNative loops and ``@ms.jit`` steps; and the ones msmon
cannot follow, refused with the reason and the fix.

The named module is a BERT-style self-attention written as users write it: ``query`` /
``key`` / ``value`` ``nn.Dense`` sub-cells, ``num_attention_heads``, an additive padding
mask (N, 1, 1, S) of -10000 at padded keys passed as ``attention_mask``. Reference: an
unmonitored twin trained by the same loop; before each collected step its weights and
batch are kept, the named modules' inputs recomputed from them in a PyNative forward pass,
and the logits by a per-head float64 loop (not our code; padded keys excluded from the max
logit, included in the softmax as the module adds them). Summary files hold float32:
PyNative rtol 1e-6, jit 2e-6 (graph kernels may round the module's input apart in the
last bit). Training is bit-identical (weights and Adam's moments).
"""

import math
import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from msmon_nb.collect.attnform import AttentionShapeError, named_form
from msmon_nb.config import CORE_METRICS
from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor

STEPS, EVERY, SEQ, WIDTH, HEADS = 7, 3, 6, 16, 4
TARGETS = [r"blocks\.\d+\.attn$"]
PATHS = ("blocks.0.attn", "blocks.1.attn")


class SelfAttention(nn.Cell):
    """BERT's self-attention: softmax(Q K^T / sqrt(d) + mask) V, heads split by hand."""

    def __init__(self, width, heads):
        super().__init__()
        self.num_attention_heads = heads
        self.query = nn.Dense(width, width)
        self.key = nn.Dense(width, width)
        self.value = nn.Dense(width, width)
        self.out = nn.Dense(width, width)

    def split(self, x):
        n, length, width = x.shape
        heads = self.num_attention_heads
        return x.reshape(n, length, heads, width // heads).transpose(0, 2, 1, 3)

    def construct(self, hidden_states, attention_mask=None):
        q = self.split(self.query(hidden_states))
        k = self.split(self.key(hidden_states))
        v = self.split(self.value(hidden_states))
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(q.shape[-1])
        if attention_mask is not None:
            scores = scores + attention_mask
        context = ops.matmul(ops.softmax(scores, -1), v).transpose(0, 2, 1, 3)
        return self.out(context.reshape(hidden_states.shape))


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attn = SelfAttention(WIDTH, HEADS)
        self.norm = nn.LayerNorm((WIDTH,))

    def construct(self, x, mask):
        return self.norm(x + self.attn(x, attention_mask=mask))


class Bert(nn.Cell):
    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.embed = nn.Dense(4, WIDTH)
        self.blocks = nn.CellList([Block(), Block()])
        self.head = nn.Dense(WIDTH, 3)

    def construct(self, x, mask):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, mask)
        return self.head(h.mean(1))


def build():
    net = Bert()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward(a, m, c):
        return loss_fn(net(a, m), c)

    return net, opt, ms.value_and_grad(forward, None, opt.parameters)


def batches():
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        x = rng.normal(size=(8, SEQ, 4)).astype(np.float32)
        y = (x[:, :, 0].sum(1) > 0).astype(np.int32) + (x[:, :, 1].sum(1) > 1)
        lengths = rng.integers(2, SEQ + 1, size=8)
        mask = np.where(np.arange(SEQ)[None] < lengths[:, None], 0.0, -10000.0)
        mask = mask.astype(np.float32).reshape(8, 1, 1, SEQ)
        yield ms.Tensor(x), ms.Tensor(mask), ms.Tensor(y.astype(np.int32))


def state(opt):
    return [t.asnumpy().copy() for t in (*opt.parameters, *opt.moment1, *opt.moment2)]


def reference(x, wq, bq, wk, bk, mask, heads):
    """max logit (padded keys excluded), the max over every key, and the mean softmax
    entropy, per head, float64."""
    d = x.shape[-1] // heads
    q, k = x @ wq.T + bq, x @ wk.T + bk
    tops, every, entropies = [], [], []
    for n in range(x.shape[0]):
        open_ = mask[n, 0, 0] == 0
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            logits = q[n, :, cols] @ k[n, :, cols].T / math.sqrt(d)
            tops.append(logits[:, open_].max())
            every.append(logits.max())
            z = logits + mask[n, 0, 0]
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            entropies.extend(-(p * np.log(np.where(p > 0, p, 1))).sum(-1))
    return max(tops), max(every), float(np.mean(entropies))


def run(shape, monitor=None):
    """Train by a PyNative or jit loop; (optimizer, {step: (inputs, weights before)})."""
    net, opt, grad_fn = build()

    def step(a, m, c):
        _, g = grad_fn(a, m, c)
        opt(g)

    if shape == "jit":
        step = ms.jit(step)
    kept = {}
    watch = monitor.watch() if monitor is not None else None
    if watch is not None:
        watch.__enter__()
    try:
        for i, (a, m, c) in enumerate(batches()):
            if monitor is None and i % EVERY == 0:
                weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
                kept[i] = ((a, m), weights)
            step(a, m, c)
    finally:
        if watch is not None:
            watch.__exit__(None, None, None)
    return opt, kept, net


def expected_from(kept):
    net, _, _ = build()
    seen = {}
    for i, block in enumerate(net.blocks):

        def hook(cell, args, kwargs, out, path=PATHS[i]):
            x = args[0].asnumpy().astype(np.float64)
            mask = kwargs["attention_mask"].asnumpy().astype(np.float64)
            held = (cell.query.weight, cell.query.bias, cell.key.weight, cell.key.bias)
            w = [p.asnumpy().astype(np.float64) for p in held]
            seen[path] = (x, *w, mask)

        block.attn.register_forward_hook(hook, with_kwargs=True)
    out = {}
    for step, (inputs, weights) in kept.items():
        for p in net.trainable_params():
            p.set_data(ms.Tensor(weights[p.name]))
        seen.clear()
        net(*inputs)
        out[step] = {}
        for path, args in seen.items():
            top, every, ent = reference(*args, HEADS)
            out[step][f"attn/{path}/max_logit"] = top
            out[step][f"attn/{path}/entropy"] = ent
            out[step][f"unmasked/{path}"] = every
    return out


@pytest.mark.parametrize("shape", ["pynative", "jit"])
def test_named_modules_exact_and_training_unchanged(tmp_path, shape):
    plain = run(shape)
    final, expected = state(plain[0]), expected_from(plain[1])
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY, attention_targets=TARGETS,
               track_metrics=[*CORE_METRICS, "attention"])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon:
            got = run(shape, mon)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert not said, said
    for want, have in zip(final, state(got[0]), strict=True):
        np.testing.assert_array_equal(have, want)
    assert all(not hasattr(type(c), "_msmon_attn_of") for _, c in got[2].cells_and_names())
    tags = [t for t in expected[0] if t.startswith("attn/")]
    series = {t: load_run(mon.run_dir).scalars(t) for t in tags}
    recorded = [t for t in load_run(mon.run_dir).tags() if t.startswith("attn/")]
    assert sorted(recorded) == sorted(tags) and len(recorded) == 4
    steps = sorted(expected)
    rtol = 1e-6 if shape == "pynative" else 2e-6
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        np.testing.assert_allclose(s.values, want, rtol=rtol, err_msg=tag)
    # the masks matter here: some collected batch pads the key of a module's largest
    # logit, so a max over every key would differ from what was recorded
    unmasked = [expected[step][f"unmasked/{path}"] for step in steps for path in PATHS]
    masked = [expected[step][f"attn/{path}/max_logit"] for step in steps for path in PATHS]
    assert any(u > m * (1 + 1e-5) for u, m in zip(unmasked, masked, strict=True))


class Rotary(SelfAttention):
    def __init__(self, width, heads):
        super().__init__(width, heads)
        self.rotary_emb = nn.Identity()


class Grouped(SelfAttention):
    def __init__(self, width, heads):
        super().__init__(width, heads)
        self.key = nn.Dense(width, width // 2)


class Headless(SelfAttention):
    def __init__(self, width, heads):
        super().__init__(width, heads)
        del self.num_attention_heads


@pytest.mark.parametrize(
    ("cls", "said"),
    [
        (Rotary, "rotary position embeddings ('rotary_emb')"),
        (Grouped, "grouped key heads are not followed"),
        (Headless, "has no head count msmon knows: set one of num_heads"),
        (nn.Dense, "holds no query and key projections msmon knows"),
    ],
)
def test_modules_that_do_not_fit_are_refused_with_the_reason(cls, said):
    cell = cls(WIDTH, HEADS) if cls is not nn.Dense else nn.Dense(WIDTH, WIDTH)
    with pytest.raises(AttentionShapeError, match="remove it from attention_targets") as err:
        named_form("blocks.0.attn", cell)
    assert said in str(err.value) and "'blocks.0.attn'" in str(err.value)


def test_a_refused_module_warns_once_and_the_others_are_recorded(tmp_path):
    """Naming a module that does not fit, and a pattern that names nothing: one warning
    each, the fitting modules recorded, training goes on."""
    net, opt, grad_fn = build()
    net.blocks[1].attn.rotary_emb = nn.Identity()  # now it rotates (by its name)
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY,
               attention_targets=[*TARGETS, "^nowhere$"],
               track_metrics=[*CORE_METRICS, "attention"])  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Monitor(**cfg) as mon, mon.watch():
            for a, m, c in batches():
                _, g = grad_fn(a, m, c)
                opt(g)
    said = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(said) == 2, said
    assert any("'blocks.1.attn'" in m and "rotary" in m for m in said), said
    assert any("'^nowhere$' names no module" in m for m in said), said
    recorded = {t for t in load_run(mon.run_dir).tags() if t.startswith("attn/")}
    assert recorded == {"attn/blocks.0.attn/max_logit", "attn/blocks.0.attn/entropy"}
