"""``attention``: each ``nn.MultiheadAttention``'s max attention logit and attention
entropy as ``attn/<module>/max_logit`` / ``attn/<module>/entropy`` on collected steps.

Reference: an unmonitored twin trained on the same batches, whose own forward hooks copy
each attention module's inputs and query/key weights at the collected steps; the logits
are recomputed from them in float64 numpy by a separate per-head loop (not our code).
Summary files hold float32 scalars: compared at rtol 1e-6. Training is bit-identical
(weights and Adam's moments), and steps that are not collected run no hook of ours.
A second check ties the recomputation to what MindSpore itself computes: its own
softmax weights (float32) give the same entropy, for every mask and key layout.
Compiled steps: test_attention_graph.
"""

import math
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.collect.attention import Snapshot, signals
from msmon_nb.config import CORE_METRICS
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor

STEPS, EVERY = 7, 3
SEQ, WIDTH, HEADS = 6, 16, 4


class Encoder(nn.Cell):
    """Two encoder layers over a causal mask, a linear read-out: a toy sequence model."""

    def __init__(self):
        super().__init__()
        ms.set_seed(0)
        self.embed = nn.Dense(4, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Dense(WIDTH, 3)
        self.mask = ms.Tensor(np.triu(np.ones((SEQ, SEQ), np.float32) * -np.inf, 1))

    def construct(self, x):
        h = self.encoder(self.embed(x), src_mask=self.mask)
        return self.head(h.mean(1))


def build():
    net = Encoder()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.01)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def forward(a, c):
        return loss_fn(net(a), c)

    return net, opt, ms.value_and_grad(forward, None, opt.parameters)


def batches():
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        x = rng.normal(size=(8, SEQ, 4)).astype(np.float32)
        y = (x[:, :, 0].sum(1) > 0).astype(np.int32) + (x[:, :, 1].sum(1) > 1)
        yield ms.Tensor(x), ms.Tensor(y.astype(np.int32))


def state(opt):
    return [t.asnumpy().copy() for t in (*opt.parameters, *opt.moment1, *opt.moment2)]


def reference(query, w_in, b_in, mask, heads):
    """max logit and mean entropy by a per-head loop, float64 (batch-first self-attention
    with a packed in-projection and an additive (L, S) mask)."""
    e = query.shape[-1]
    d = e // heads
    q = query @ w_in[:e].T + b_in[:e]
    k = query @ w_in[e : 2 * e].T + b_in[e : 2 * e]
    tops, entropies = [], []
    for n in range(query.shape[0]):
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            logits = np.einsum("ld,sd->ls", q[n, :, cols], k[n, :, cols]) / math.sqrt(d)
            tops.append(logits[np.isfinite(mask)].max())
            z = logits + mask
            p = np.exp(z - z.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            entropies.extend(-(p * np.log(np.where(p > 0, p, 1))).sum(-1))
    return max(tops), float(np.mean(entropies))


def twin():
    net, opt, grad_fn = build()
    seen = {}
    for i, layer in enumerate(net.encoder.layers):

        def hook(cell, args, kwargs, out, path=f"encoder.layers.{i}.self_attn"):
            seen.setdefault(
                path,
                (
                    args[0].asnumpy().astype(np.float64),
                    cell.in_proj_weight.asnumpy().astype(np.float64),
                    cell.in_proj_bias.asnumpy().astype(np.float64),
                    kwargs["attn_mask"].asnumpy().astype(np.float64),
                ),
            )

        layer.self_attn.register_forward_hook(hook, with_kwargs=True)
    expected = {}
    for step, (a, c) in enumerate(batches()):
        seen.clear()
        _, g = grad_fn(a, c)
        opt(g)
        if step % EVERY == 0:
            expected[step] = {}
            for path, (x, w, b, m) in seen.items():
                top, ent = reference(x, w, b, m, HEADS)
                expected[step][f"attn/{path}/max_logit"] = top
                expected[step][f"attn/{path}/entropy"] = ent
    return expected, state(opt)


def test_pynative_exact_against_float64_reference_and_training_unchanged(tmp_path):
    expected, final = twin()
    cfg = dict(save_dir=str(tmp_path), log_interval=EVERY,
               track_metrics=[*CORE_METRICS, "attention"])  # fmt: skip
    _, opt, grad_fn = build()
    with Monitor(**cfg) as mon, mon.watch() as watch:
        for a, c in batches():
            _, g = grad_fn(a, c)
            opt(g)
    for want, got in zip(final, state(opt), strict=True):
        np.testing.assert_array_equal(got, want)
    run = load_run(mon.run_dir)
    series = {t: run.scalars(t) for t in run.tags() if t.startswith("attn/")}
    assert set(series) == set(expected[0]) and len(series) == 4
    assert not any(re.match("act/", t) for t in run.tags())  # attention alone: no act/
    steps = sorted(expected)
    for tag, s in series.items():
        assert s.steps.tolist() == steps, tag
        want = np.array([expected[step][tag] for step in steps])
        np.testing.assert_allclose(s.values, want, rtol=1e-6, err_msg=tag)
    # entropies are of 1..6 open keys: between 0 and log 6, and the causal mask counts
    ent = series["attn/encoder.layers.0.self_attn/entropy"].values
    assert (ent > 0).all() and (ent < math.log(SEQ)).all()
    assert watch.acts.calls == len(steps) * 2  # hooks on collected steps only
    assert not watch.acts.handles


def test_with_activations_too_and_output_logit_is_the_head_max_abs(tmp_path):
    cfg = dict(save_dir=str(tmp_path), log_interval=1, module_targets=["^head$"],
               track_metrics=[*CORE_METRICS, "activations", "attention"])  # fmt: skip
    net, opt, grad_fn = build()
    logits = []
    net.head.register_forward_hook(lambda c, i, o: logits.append(np.abs(o.asnumpy()).max()))
    with Monitor(**cfg) as mon, mon.watch():
        for a, c in batches():
            _, g = grad_fn(a, c)
            opt(g)
    run = load_run(mon.run_dir)
    assert len([t for t in run.tags() if t.startswith("attn/")]) == 4
    got = run.scalars("act/head/max_abs").values
    np.testing.assert_array_equal(got, np.float32(logits))


CASES = ["plain", "causal_bool", "key_padding", "bias_kv_zero_attn", "separate_kdim", "seq_first"]


@pytest.mark.parametrize("case", CASES)
def test_recomputation_matches_mindspores_own_softmax(case):
    """Our float64 entropy vs the entropy of MindSpore's own attention weights (float32):
    masks, appended keys, separate key widths and sequence-first layouts read alike."""
    ms.set_seed(3)
    rng = np.random.default_rng(3)
    kw = dict(batch_first=case != "seq_first")
    if case == "bias_kv_zero_attn":
        kw.update(add_bias_kv=True, add_zero_attn=True)
    if case == "separate_kdim":
        kw.update(kdim=6, vdim=6)
    mha = nn.MultiheadAttention(8, 2, **kw)
    q = rng.normal(size=(3, 5, 8)).astype(np.float32)
    k = rng.normal(size=(3, 5, 6 if case == "separate_kdim" else 8)).astype(np.float32)
    if case == "seq_first":
        q, k = q.swapaxes(0, 1).copy(), k.swapaxes(0, 1).copy()
    q, k = ms.Tensor(q), ms.Tensor(k)
    extra = {}
    if case == "causal_bool":
        extra["attn_mask"] = ms.Tensor(np.triu(np.ones((5, 5), bool), 1))
    if case == "key_padding":
        pad = np.zeros((3, 5), bool)
        pad[0, 3:] = True
        extra["key_padding_mask"] = ms.Tensor(pad)
    self_attn = case not in ("separate_kdim",)
    key = q if self_attn else k
    _, weights = mha(q, key, key, average_attn_weights=False, **extra)
    got = signals(Snapshot(mha, (q, key, key), extra))
    w = weights.asnumpy().astype(np.float64)
    entropy = float(np.mean(-(w * np.log(np.where(w > 0, w, 1))).sum(-1)))
    assert got["entropy"] == pytest.approx(entropy, rel=2e-6)
    assert np.isfinite(got["max_logit"])
